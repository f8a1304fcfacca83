"""A node's inventory and labels -> the content of its pool of ResourceSlices (no I/O).

One pool per node, named after the node, for driver ``neuron.aws.com``. Chip devices are
``neurondevice0..N-1`` (``resourceType: neuron_device``); UltraServer nodes also get one
``neuronnode`` device (``resourceType: neuron_node``) standing for the whole node.

Why the node device never reaches a chip request:

* every device carries ``instanceType``, ``neuronDriverVersion`` and ``resourceType``, because
  a selector that reads a missing attribute is a CEL runtime error that blocks the whole node;
* the node device's ``instanceType`` is the empty string (the node's type is in
  ``nodeInstanceType`` on every device), so a chip request written as AWS's Neuron DRA driver
  guide writes it (``instanceType == 'trn2u.48xlarge'``) never matches it, and
  ``allocationMode: All`` over chips is not turned into "all chips *and* the node";
* it comes after the chips in the pool, so a request without any selector gets chips first.

Why a chip and the node device are never handed to two claims at once depends on
:class:`NodeDeviceMode`: with ``counters`` (partitionable devices, Kubernetes 1.36) each chip
consumes its own counter of a shared counter set and the node device consumes all of them, so
the scheduler refuses any overlap; on a cluster without partitionable devices the publisher
never publishes both kinds for one node (``node-only`` or ``chips-only``).
"""

from __future__ import annotations

import enum
import functools
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, Final

import msgspec
from neuron_dra_common.driver import (
    DEVICE_RESOURCE_TYPE,
    DRIVER_NAME,
    NODE_DEVICE,
    NODE_RESOURCE_TYPE,
    device_name,
)
from neuron_dra_common.hardware.model import NeuronDevice, NodeHardware
from neuron_dra_common.topology import (
    InstanceSpec,
    UnknownInstanceType,
    device_attributes,
    instance_spec,
    logical_cores_per_device,
)

__all__ = [
    "CAPACITY_BLOCK_LABEL",
    "COUNTER_SET",
    "DOMAIN",
    "MAX_ATTRIBUTES",
    "NETWORK_LAYER_LABELS",
    "InventoryError",
    "NodeDeviceMode",
    "PoolContent",
    "SliceContent",
    "build_pool",
    "content_hash",
]

#: Attributes without a domain in their name belong to the driver's domain.
DOMAIN: Final = DRIVER_NAME
COUNTER_SET: Final = "neuron-devices"

MAX_DEVICES: Final = 128
MAX_DEVICES_ADVANCED: Final = 64  # any device with counters or taints
MAX_ATTRIBUTES: Final = 32  # attributes + capacities per device
MAX_VALUE_LENGTH: Final = 64

CAPACITY_BLOCK_LABEL: Final = "topology.k8s.aws/capacity-block-id"
SERVER_ID_4_LABEL: Final = "neuron.amazonaws.com/ultraserver-server-id-4"
NODE_ID_4_LABEL: Final = "neuron.amazonaws.com/ultraserver-node-id-4"
NETWORK_LAYER_LABELS: Final = {
    f"networkNodeLayer{n}": f"topology.k8s.aws/network-node-layer-{n}" for n in (1, 2, 3)
}

AttributeJson = dict[str, Any]


class InventoryError(ValueError):
    """An inventory no pool can be built from; the message names the node and the field."""


class NodeDeviceMode(enum.StrEnum):
    """How chip devices and the UltraServer node device are kept exclusive."""

    COUNTERS = "counters"
    """Both kinds, exclusive through shared counters (needs partitionable devices)."""
    NODE_ONLY = "node-only"
    """UltraServer nodes publish only the node device; other nodes their chips."""
    CHIPS_ONLY = "chips-only"
    """Only chips; whole UltraServer nodes are asked for with ``allocationMode: All``."""


class SliceContent(msgspec.Struct, frozen=True, kw_only=True):
    """One slice of a pool: either ``devices`` or ``shared_counters`` (never both)."""

    devices: tuple[dict[str, Any], ...] = ()
    shared_counters: tuple[dict[str, Any], ...] = ()


class PoolContent(msgspec.Struct, frozen=True, kw_only=True):
    """What a node's pool should hold; ``skipped`` lists values left out, and why."""

    node: str
    slices: tuple[SliceContent, ...]
    skipped: tuple[str, ...] = ()

    @property
    def device_names(self) -> tuple[str, ...]:
        return tuple(d["name"] for s in self.slices for d in s.devices)


def content_hash(content: SliceContent) -> str:
    """A stable digest of one slice's content, to tell whether a stored slice is current."""
    return hashlib.sha256(msgspec.json.encode(content, order="deterministic")).hexdigest()[:32]


class _Builder:
    def __init__(self, node: str) -> None:
        self.node = node
        self.skipped: list[str] = []

    def value(self, name: str, value: int | str | bool) -> AttributeJson | None:
        if isinstance(value, bool):
            return {"bool": value}
        if isinstance(value, int):
            return {"int": value}
        if len(value) > MAX_VALUE_LENGTH:
            self.skipped.append(
                f"attribute {name}: value {value[:20]!r}... is longer than {MAX_VALUE_LENGTH}"
            )
            return None
        return {"string": value}

    def attributes(self, values: Mapping[str, int | str | bool]) -> dict[str, AttributeJson]:
        out: dict[str, AttributeJson] = {}
        for name, raw in values.items():
            encoded = self.value(name, raw)
            if encoded is not None:
                out[name] = encoded
        return out


@functools.cache
def _topology(instance_type: str) -> tuple[dict[str, int | str], ...]:
    # The same for every node of a type, and the SHA-256 group ids are the costly part.
    spec = instance_spec(instance_type)
    return tuple(device_attributes(spec, i) for i in range(spec.devices))


def _spec(inventory_node: str, hardware: NodeHardware) -> InstanceSpec:
    if not hardware.instance_type:
        raise InventoryError(f"NodeInventory {inventory_node}: hardware.instance_type is empty")
    try:
        return instance_spec(hardware.instance_type)
    except UnknownInstanceType as exc:
        raise InventoryError(
            f"NodeInventory {inventory_node}: hardware.instance_type: {exc}"
        ) from None


def _reported(hardware: NodeHardware, spec: InstanceSpec) -> str:
    # The name the node itself reports (DMI, IMDS), as its Node label carries it: a Trn3
    # UltraServer node is a "trn3pds" one in AWS's operator guide, trn3.48xlarge in the catalog.
    return hardware.instance_type.strip().lower() or spec.name


def _node_values(
    hardware: NodeHardware, *, spec: InstanceSpec, labels: Mapping[str, str], dra_version: str
) -> dict[str, int | str | bool]:
    """Attributes every device of the node shares."""
    values: dict[str, int | str | bool] = {
        "nodeInstanceType": _reported(hardware, spec),
        "neuronDriverVersion": hardware.driver_version or "",
        "draDriverVersion": dra_version,
    }
    if CAPACITY_BLOCK_LABEL in labels:
        values["capacityBlockId"] = labels[CAPACITY_BLOCK_LABEL]
    us = hardware.ultraserver
    server = us.server_id_4 if us is not None and us.server_id_4 else labels.get(SERVER_ID_4_LABEL)
    if us is not None and us.reservation_id:
        server = us.reservation_id
    if server:
        values["ultraserverId"] = server
    node_id = None
    if us is not None:
        node_id = us.node_id_4 if us.node_id_4 is not None and us.node_id_4 >= 0 else us.node_id
    if node_id is None and labels.get(NODE_ID_4_LABEL, "").isdigit():
        node_id = int(labels[NODE_ID_4_LABEL])
    if node_id is not None and node_id >= 0 and server:
        values["ultraserverNodeId"] = node_id
    for name, label in NETWORK_LAYER_LABELS.items():
        if label in labels:
            values[name] = labels[label]
    return values


def _chip(
    device: NeuronDevice,
    *,
    spec: InstanceSpec,
    hardware: NodeHardware,
    shared: Mapping[str, int | str | bool],
    builder: _Builder,
    counters: bool,
) -> dict[str, Any]:
    values: dict[str, int | str | bool] = {
        "deviceId": device.index,
        "instanceType": _reported(hardware, spec),
        "resourceType": DEVICE_RESOURCE_TYPE,
        **shared,
    }
    if device.index < spec.devices:
        values.update(_topology(spec.name)[device.index])
    if device.numa_node is not None:
        values["numaNode"] = device.numa_node
    memory = device.memory_bytes or spec.memory_bytes_per_device
    cores = device.logical_cores or logical_cores_per_device(spec, hardware.default_lnc)
    body: dict[str, Any] = {
        "name": device_name(device.index),
        "attributes": builder.attributes(values),
        "capacity": {"memory": {"value": str(memory)}, "neuronCores": {"value": str(cores)}},
    }
    if counters:
        body["consumesCounters"] = [
            {"counterSet": COUNTER_SET, "counters": {device_name(device.index): {"value": "1"}}}
        ]
    return body


def _node_device(
    chips: list[dict[str, Any]],
    *,
    shared: Mapping[str, int | str | bool],
    hardware: NodeHardware,
    builder: _Builder,
    counters: bool,
) -> dict[str, Any]:
    values: dict[str, int | str | bool] = {
        # Empty on purpose: a chip selector on instanceType must never match the node.
        "instanceType": "",
        "resourceType": NODE_RESOURCE_TYPE,
        "deviceCount": len(chips),
        **shared,
    }
    us = hardware.ultraserver
    if us is not None and us.supported_modes:
        values["ultraserverModes"] = ",".join(str(m) for m in us.supported_modes)
    memory = sum(int(c["capacity"]["memory"]["value"]) for c in chips)
    cores = sum(int(c["capacity"]["neuronCores"]["value"]) for c in chips)
    body: dict[str, Any] = {
        "name": NODE_DEVICE,
        "attributes": builder.attributes(values),
        "capacity": {"memory": {"value": str(memory)}, "neuronCores": {"value": str(cores)}},
    }
    if counters:
        body["consumesCounters"] = [
            {
                "counterSet": COUNTER_SET,
                "counters": {c["name"]: {"value": "1"} for c in chips},
            }
        ]
    return body


def _chunks(devices: list[dict[str, Any]], size: int) -> list[SliceContent]:
    return [
        SliceContent(devices=tuple(devices[i : i + size])) for i in range(0, len(devices), size)
    ]


def build_pool(
    *,
    node: str,
    hardware: NodeHardware,
    labels: Mapping[str, str],
    mode: NodeDeviceMode,
    dra_driver_version: str,
    workload_id: str = "",
    taints: Mapping[str, Sequence[Mapping[str, str]]] | None = None,
    hide_tainted: bool = False,
) -> PoolContent:
    """The pool of ``node``: its slices in the order the scheduler should try them.

    ``workload_id`` (from the UltraServer operator's record on the Node) tags every device.
    ``taints`` (device name -> DRA device taints) go on those devices; with ``hide_tainted``
    (a cluster that does not serve device taints) those devices are left out of the pool
    instead, so that no claim can be allocated them.

    >>> from neuron_dra_common.hardware.model import NodeHardware, NeuronDevice
    >>> hw = NodeHardware(instance_type="trn2.48xlarge", driver_version="2.24.7.0",
    ...                   devices=tuple(NeuronDevice(index=i) for i in range(16)))
    >>> pool = build_pool(node="n1", hardware=hw, labels={}, mode=NodeDeviceMode.COUNTERS,
    ...                   dra_driver_version="0.1.0")
    >>> pool.device_names[:2], len(pool.slices)
    (('neurondevice0', 'neurondevice1'), 1)
    """
    spec = _spec(node, hardware)
    builder = _Builder(node)
    shared = _node_values(hardware, spec=spec, labels=labels, dra_version=dra_driver_version)
    if workload_id:
        shared["workloadId"] = workload_id
    ultraserver_node = spec.ultraserver_nodes > 1
    with_node = ultraserver_node and mode is not NodeDeviceMode.CHIPS_ONLY
    with_chips = not (ultraserver_node and mode is NodeDeviceMode.NODE_ONLY)
    counters = with_node and with_chips and mode is NodeDeviceMode.COUNTERS
    devices = sorted(hardware.devices, key=lambda d: d.index)
    if len(devices) > MAX_DEVICES_ADVANCED and counters:
        raise InventoryError(
            f"NodeInventory {node}: hardware.devices: {len(devices)} devices do not fit one "
            f"counter set slice of {MAX_DEVICES_ADVANCED}"
        )
    chips = [
        _chip(d, spec=spec, hardware=hardware, shared=shared, builder=builder, counters=counters)
        for d in devices
    ]
    published: list[dict[str, Any]] = list(chips) if with_chips else []
    if with_node and chips:
        published.append(
            _node_device(
                chips, shared=shared, hardware=hardware, builder=builder, counters=counters
            )
        )
    tainted = {name: list(t) for name, t in (taints or {}).items() if t}
    if hide_tainted:
        published = [d for d in published if d["name"] not in tainted]
    else:
        for device in published:
            if device["name"] in tainted:
                device["taints"] = [dict(t) for t in tainted[device["name"]]]
    for device in published:
        if len(device["attributes"]) + len(device["capacity"]) > MAX_ATTRIBUTES:
            raise InventoryError(
                f"NodeInventory {node}: device {device['name']} has more than {MAX_ATTRIBUTES} "
                "attributes and capacities"
            )
    slices: list[SliceContent] = []
    if counters:
        # A slice holds devices or counters, never both: the counters get their own slice.
        counter_set = {
            "name": COUNTER_SET,
            "counters": {c["name"]: {"value": "1"} for c in chips},
        }
        slices.append(SliceContent(shared_counters=(counter_set,)))
    with_taints = any("taints" in d for d in published)
    limit = MAX_DEVICES_ADVANCED if counters or with_taints else MAX_DEVICES
    slices += _chunks(published, limit)
    return PoolContent(node=node, slices=tuple(slices), skipped=tuple(builder.skipped))
