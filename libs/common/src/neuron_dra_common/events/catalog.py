"""Every event the services exchange, one frozen Struct per type and version.

Evolution rules (checked by ``tests/unit/events``): a field added to an existing version
always has a default; a field's type never changes and a field is never removed. Anything
else is a new tag (``...v2``) added to the union beside the old one.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Literal

import msgspec

from neuron_dra_common.events.base import SUBJECT_ROOT, Event, subject_token
from neuron_dra_common.hardware.model import NodeHardware

__all__ = [
    "AlertStateChanged",
    "AlertStatus",
    "AllocationDecided",
    "AllocationReleased",
    "AllocationRequested",
    "ClaimPrepared",
    "ClaimUnprepared",
    "DeviceHealth",
    "DeviceHealthChanged",
    "DeviceTaint",
    "DeviceTaintChanged",
    "HealthSeverity",
    "NodeHeartbeat",
    "NodeInventory",
    "NodeLost",
    "NodeRecovered",
    "ObjectRef",
    "UltraServerGrant",
    "UltraServerRefusal",
    "WorkloadStateChanged",
]

DeviceHealth = Literal["Healthy", "Unhealthy", "Unknown"]
HealthSeverity = Literal["", "degraded", "uncorrectable"]


class ObjectRef(msgspec.Struct, frozen=True, kw_only=True):
    """A namespaced Kubernetes object an event is about."""

    namespace: str
    name: str
    uid: str = ""

    @property
    def token(self) -> str:
        return f"{subject_token(self.namespace)}.{subject_token(self.name)}"


class NodeInventory(Event, frozen=True, kw_only=True, tag="node.inventory.v1"):
    """What a node has, published by discovery at start and whenever it changes.

    ``generation`` grows with every inventory a discovery process publishes; together with
    ``boot_id`` it lets a reader drop an inventory older than one it already applied.
    """

    node: str
    boot_id: str
    generation: int
    hardware: NodeHardware
    dra_driver_version: str = ""
    observed_at: datetime | None = None

    @property
    def subject(self) -> str:
        return f"{SUBJECT_ROOT}.inventory.{subject_token(self.node)}"

    @property
    def ce_subject(self) -> str:
        return f"nodes/{self.node}"


class NodeHeartbeat(Event, frozen=True, kw_only=True, tag="node.heartbeat.v1"):
    """A node's discovery is alive; a missing run of these marks the node lost.

    ``stopping`` marks a process's last heartbeat, sent when it is stopped in an orderly way
    (SIGTERM: a rolling update, a restart): the silence that follows is a restart, not a dead
    node, and the failure detector waits longer for the next heartbeat. A process killed
    without warning sends none.
    """

    node: str
    boot_id: str
    sequence: int
    sent_at: datetime
    interval_seconds: float = 10.0
    #: The sending process (random per process start): a restarted process numbers its
    #: heartbeats from 1 again, and they are not repeats of its predecessor's.
    instance: str = ""
    #: True on the goodbye: the process is stopping and sends no more heartbeats.
    stopping: bool = False
    #: > 0: this one is the agent's hello (or goodbye) and its beats in between are alive
    #: beats on ``NEURON_ALIVE`` that the bus keeps for this many seconds (``ttl`` heartbeat
    #: mode); 0: every beat is a ``NodeHeartbeat`` here.
    alive_ttl_seconds: float = 0.0

    @property
    def subject(self) -> str:
        return f"{SUBJECT_ROOT}.heartbeat.{subject_token(self.node)}"

    @property
    def ce_subject(self) -> str:
        return f"nodes/{self.node}"


class DeviceHealthChanged(Event, frozen=True, kw_only=True, tag="device.health.v1"):
    """A device's health moved from ``previous`` to ``health``."""

    node: str
    device: str
    health: DeviceHealth
    previous: DeviceHealth = "Unknown"
    reason: str = ""
    error_code: str = ""
    observed_at: datetime | None = None
    #: What failed, by the kernel log's ``NEURON_HW_ERR=`` name where one exists
    #: (``SRAM_UNCORRECTABLE_ERROR``, ``NC_UNCORRECTABLE_ERROR``, ``HBM_UNCORRECTABLE_ERROR``,
    #: ``DMA_ERROR``), else ``HBM_REPAIRABLE_ERROR`` or ``NEURONLINK_DOWN``; empty when healthy.
    error_type: str = ""
    #: ``degraded`` (usable, keep new work away) or ``uncorrectable`` (move work off);
    #: empty with ``health`` Healthy: the repair.
    severity: HealthSeverity = ""
    #: The kernel-log line or counter delta that proves it.
    evidence: str = ""
    #: What the operator should do: ``reload-driver-or-reboot`` or ``replace-instance``.
    action: str = ""
    #: The NeuronCore (``nc-id``) when the kernel line names one.
    core: int | None = None

    @property
    def subject(self) -> str:
        return f"{SUBJECT_ROOT}.health.{subject_token(self.node)}.{subject_token(self.device)}"

    @property
    def ce_subject(self) -> str:
        return f"nodes/{self.node}/devices/{self.device}"


class DeviceTaint(msgspec.Struct, frozen=True, kw_only=True, order=True):
    """One DRA device taint as the ResourceSlice holds it (``timeAdded`` is the server's)."""

    key: str
    value: str = ""
    #: ``NoSchedule`` or ``NoExecute``.
    effect: str


class DeviceTaintChanged(Event, frozen=True, kw_only=True, tag="device.taint.v1"):
    """The slice publisher changed a device's taints in its node's pool.

    ``taints`` is the device's whole set now (empty: all cleared), ``previous`` the set it
    replaced. Published once per change, not on every write of the pool.
    """

    node: str
    device: str
    taints: tuple[DeviceTaint, ...] = ()
    previous: tuple[DeviceTaint, ...] = ()
    #: Why: the health report or the failure detector's verdict behind the change.
    reason: str = ""
    #: True where the cluster does not serve device taints (Kubernetes 1.34): the device is
    #: left out of the pool for as long as it has taints, instead of listed with them.
    withheld: bool = False
    #: The generation of the node's pool that first carries the change.
    pool_generation: int = 0
    changed_at: datetime | None = None

    @property
    def subject(self) -> str:
        return f"{SUBJECT_ROOT}.taint.{subject_token(self.node)}.{subject_token(self.device)}"

    @property
    def ce_subject(self) -> str:
        return f"nodes/{self.node}/devices/{self.device}"


class NodeLost(Event, frozen=True, kw_only=True, tag="node.lost.v1"):
    """The cluster failure detector declared ``node`` lost: its heartbeats stopped."""

    node: str
    last_heartbeat_at: datetime | None = None
    detected_at: datetime
    reason: str = ""

    @property
    def subject(self) -> str:
        return f"{SUBJECT_ROOT}.health.{subject_token(self.node)}.node"

    @property
    def ce_subject(self) -> str:
        return f"nodes/{self.node}"


class NodeRecovered(Event, frozen=True, kw_only=True, tag="node.recovered.v1"):
    """A node declared lost sends heartbeats again, steadily."""

    node: str
    detected_at: datetime
    lost_for_seconds: float = 0.0

    @property
    def subject(self) -> str:
        return f"{SUBJECT_ROOT}.health.{subject_token(self.node)}.node"

    @property
    def ce_subject(self) -> str:
        return f"nodes/{self.node}"


class AllocationRequested(Event, frozen=True, kw_only=True, tag="allocation.requested.v1"):
    """The operator asks the allocator for UltraServer capacity for a workload."""

    request_id: str
    workload: ObjectRef
    topology_size: int
    instance_type: str = ""
    ultraserver_mode: int | None = None
    exclude_ultraservers: tuple[str, ...] = ()
    #: How many UltraServers of ``topology_size`` nodes, all or nothing.
    server_count: int = 1
    #: The workload's metadata.generation; a decision is idempotent per (uid, generation).
    generation: int = 0
    #: An allocation the workload already records: the allocator keeps (or takes back) exactly
    #: these nodes instead of placing anew, so its projection converges on the CRs' truth.
    nodes: tuple[str, ...] = ()

    @property
    def subject(self) -> str:
        return f"{SUBJECT_ROOT}.allocation.requested.{self.workload.token}"

    @property
    def ce_subject(self) -> str:
        return f"neuronultraserverworkloads/{self.workload.namespace}/{self.workload.name}"


class UltraServerGrant(msgspec.Struct, frozen=True, kw_only=True):
    """One UltraServer's share of a granted allocation.

    ``nodes`` are node names ordered by their node id in the UltraServer (``node_ids``), so
    ``nodes[0]`` is the leader and a node's position is its ``nodeIndex`` in the rank formula
    ``topoID = index * len(nodes) + nodeIndex``. ``mode`` is the driver's ultraserver_mode
    enum and ``server_id`` the driver's server id for that size.
    """

    ultraserver: str
    index: int
    nodes: tuple[str, ...]
    node_ids: tuple[int, ...] = ()
    mode: int = 0
    server_id: str = ""


class UltraServerRefusal(msgspec.Struct, frozen=True, kw_only=True):
    """Why one UltraServer could not take (part of) a request.

    ``code`` is one of ``too-few-healthy-nodes``, ``mode-not-supported``, ``taken``,
    ``instance-type``, ``excluded``; ``holders`` names the workloads (``ns/name``) that hold
    its nodes.
    """

    ultraserver: str
    code: str
    detail: str = ""
    holders: tuple[str, ...] = ()


class AllocationDecided(Event, frozen=True, kw_only=True, tag="allocation.decided.v1"):
    """The allocator's answer to one :class:`AllocationRequested`.

    ``ultraservers`` and ``nodes`` are empty when ``granted`` is false; ``reason`` then says
    why no capacity fits and ``refusals`` says it per UltraServer.
    """

    request_id: str
    workload: ObjectRef
    granted: bool
    ultraservers: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    reason: str = ""
    generation: int = 0
    topology_size: int = 0
    grants: tuple[UltraServerGrant, ...] = ()
    refusals: tuple[UltraServerRefusal, ...] = ()

    @property
    def subject(self) -> str:
        return f"{SUBJECT_ROOT}.allocation.decided.{self.workload.token}"

    @property
    def ce_subject(self) -> str:
        return f"neuronultraserverworkloads/{self.workload.namespace}/{self.workload.name}"


class AllocationReleased(Event, frozen=True, kw_only=True, tag="allocation.released.v1"):
    """A workload's UltraServer nodes went back to the free pool (or nothing was held)."""

    request_id: str
    workload: ObjectRef
    ultraservers: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()

    @property
    def subject(self) -> str:
        return f"{SUBJECT_ROOT}.allocation.released.{self.workload.token}"

    @property
    def ce_subject(self) -> str:
        return f"neuronultraserverworkloads/{self.workload.namespace}/{self.workload.name}"


class ClaimPrepared(Event, frozen=True, kw_only=True, tag="claim.prepared.v1"):
    """The kubelet plugin prepared a ResourceClaim on a node (CDI devices written).

    ``admin_access`` names those of ``devices`` the claim got with admin access (a monitoring
    pod's): shown to its containers, held by no one, so not a second holder of the device."""

    node: str
    claim: ObjectRef
    devices: tuple[str, ...]
    cdi_devices: tuple[str, ...] = ()
    workload_id: str = ""
    admin_access: tuple[str, ...] = ()

    @property
    def subject(self) -> str:
        return f"{SUBJECT_ROOT}.claim.prepared.{subject_token(self.node)}.{self.claim.token}"

    @property
    def ce_subject(self) -> str:
        return f"resourceclaims/{self.claim.namespace}/{self.claim.name}"


class ClaimUnprepared(Event, frozen=True, kw_only=True, tag="claim.unprepared.v1"):
    """The kubelet plugin released a ResourceClaim on a node."""

    node: str
    claim: ObjectRef
    devices: tuple[str, ...] = ()

    @property
    def subject(self) -> str:
        return f"{SUBJECT_ROOT}.claim.unprepared.{subject_token(self.node)}.{self.claim.token}"

    @property
    def ce_subject(self) -> str:
        return f"resourceclaims/{self.claim.namespace}/{self.claim.name}"


class WorkloadStateChanged(Event, frozen=True, kw_only=True, tag="workload.state.v1"):
    """A NeuronUltraServerWorkload moved from ``previous`` to ``state``."""

    workload: ObjectRef
    state: str
    previous: str = ""
    reason: str = ""
    ultraservers: tuple[str, ...] = ()

    @property
    def subject(self) -> str:
        return f"{SUBJECT_ROOT}.workload.{self.workload.token}"

    @property
    def ce_subject(self) -> str:
        return f"neuronultraserverworkloads/{self.workload.namespace}/{self.workload.name}"


AlertStatus = Literal["firing", "resolved"]


class AlertStateChanged(Event, frozen=True, kw_only=True, tag="alert.state.v1"):
    """The alerts service fired or resolved an alert (what it sent to Alertmanager).

    ``key`` names the alert (``alertname`` and what it is about); ``labels`` and
    ``annotations`` are as sent. ``cause_sequence`` is the audit stream's sequence of the
    event that changed the alert: an older event delivered again never changes it back.
    The latest state per alert is kept, so the alerts service rebuilds what is firing from it.
    """

    key: str
    alertname: str
    status: AlertStatus
    labels: dict[str, str]
    annotations: dict[str, str] = msgspec.field(default_factory=dict)
    starts_at: datetime
    ends_at: datetime | None = None
    cause_sequence: int = 0
    cause_id: str = ""

    @property
    def subject(self) -> str:
        digest = hashlib.sha256(self.key.encode()).hexdigest()[:16]
        return f"{SUBJECT_ROOT}.alert.{subject_token(self.alertname)}.{digest}"

    @property
    def ce_subject(self) -> str:
        return f"alerts/{self.key}"
