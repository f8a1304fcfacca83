"""What preparing one claim on this node means, decided without any I/O.

:func:`plan_prepare` takes the claim object, the node and the checkpoint and returns the
checkpoint entry and the CDI spec to write, or raises :class:`PrepareError` with the message
the kubelet shows for that claim (and only that claim).
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec
from neuron_dra_common import cdi
from neuron_dra_common.driver import (
    ANNOTATION_ADMIN_ACCESS,
    ANNOTATION_CLAIM,
    ANNOTATION_DEVICE,
    ANNOTATION_REQUESTS,
    DRIVER_NAME,
    NODE_DEVICE,
    device_index,
)
from neuron_dra_common.hardware.model import NodeHardware
from neuron_dra_common.topology import InstanceSpec, instance_spec

from neuron_dra_kubelet_plugin.checkpoint import (
    Checkpoint,
    ClaimEntry,
    ClaimState,
    PreparedDevice,
)
from neuron_dra_kubelet_plugin.claims import ClaimRef, ResourceClaim, parent_request
from neuron_dra_kubelet_plugin.config import ConfigError, decode_configs, effective_config
from neuron_dra_kubelet_plugin.edits import (
    EditsError,
    UltraServerPlacement,
    claim_edits,
    lnc_in_force,
    ultraserver_env,
)

__all__ = [
    "ClaimPlan",
    "NodeContext",
    "PrepareError",
    "entry_from_spec",
    "plan_prepare",
]


class PrepareError(Exception):
    """Preparing (or unpreparing) one claim failed; the message is for the user."""


class NodeContext(msgspec.Struct, frozen=True, kw_only=True):
    """What prepare needs to know about this node.

    ``pool`` is the node's pool (its node name). ``node_device`` is the name of the
    whole-node device when the node publishes one: it stands for every device.
    """

    pool: str
    instance: InstanceSpec
    devices: frozenset[int]
    default_lnc: int | None = None
    supported_ultraserver_modes: tuple[int, ...] = ()
    dev_root: str = "/dev"
    driver: str = DRIVER_NAME
    cdi_kind: str = cdi.NEURON_CDI_KIND
    node_device: str | None = None

    @classmethod
    def from_hardware(
        cls, hardware: NodeHardware, *, pool: str, dev_root: str = "/dev"
    ) -> NodeContext:
        """The context of a node as discovery describes it."""
        us = hardware.ultraserver
        return cls(
            pool=pool,
            instance=instance_spec(hardware.instance_type),
            devices=frozenset(d.index for d in hardware.devices),
            default_lnc=hardware.default_lnc,
            supported_ultraserver_modes=us.supported_modes if us else (),
            dev_root=dev_root,
        )


class ClaimPlan(msgspec.Struct, frozen=True, kw_only=True):
    """The completed checkpoint entry and the CDI spec of a claim."""

    entry: ClaimEntry
    spec: cdi.Spec


def _indices(node: NodeContext, device: str, ref: ClaimRef) -> tuple[int, ...]:
    if node.node_device is not None and device == node.node_device:
        return tuple(sorted(node.devices))
    index = device_index(device)
    if index is None or index not in node.devices:
        raise PrepareError(f"{ref}: device {device} does not exist on node {node.pool}")
    return (index,)


def _holds(node: NodeContext, device: str) -> frozenset[int] | None:
    """The Neuron devices of this node that ``device`` (a name in its pool) holds.

    ``None`` for a name that is neither: such a device can only clash with its own name.
    The whole-node device is recognised by its contract name too, so an entry written
    while the node published it still counts after a setting changed.
    """
    if device in (NODE_DEVICE, node.node_device):
        return node.devices
    index = device_index(device)
    return None if index is None else frozenset((index,))


def _refuse_overlaps(
    ref: ClaimRef,
    node: NodeContext,
    *,
    checkpoint: Checkpoint,
    wanted: dict[str, tuple[int, ...]],
) -> None:
    """Refuse ``wanted`` (device name -> the Neuron devices it holds) when another claim's
    prepared devices hold any of the same Neuron devices.

    Names alone are not enough: ``neuronnode`` and ``neurondevice3`` share a chip, and a
    scheduler that lost the shared counters (node-only slices) can hand them to two claims.
    """
    for entry in checkpoint.claims.values():
        if entry.uid == ref.uid:
            continue
        for held in entry.devices:
            if held.pool != node.pool or held.admin_access:
                continue
            held_chips = _holds(node, held.device)
            for device, chips in wanted.items():
                holder = f"ResourceClaim {entry.namespace}/{entry.name} ({entry.uid})"
                if device == held.device:
                    raise PrepareError(f"{ref}: device {device} is already prepared for {holder}")
                if held_chips is None or held_chips.isdisjoint(chips):
                    continue
                how = "holds" if held_chips < frozenset(chips) else "is part of"
                raise PrepareError(
                    f"{ref}: device {device} {how} {held.device}, which is already prepared "
                    f"for {holder}"
                )


def _single(values: Iterable[int | None], what: str, ref: ClaimRef) -> int | None:
    distinct = sorted({v for v in values if v is not None})
    if len(distinct) > 1:
        listed = ", ".join(str(v) for v in distinct)
        raise PrepareError(
            f"{ref}: requests ask for different {what} ({listed}); one claim's devices share "
            "one setting"
        )
    return distinct[0] if distinct else None


def plan_prepare(
    *,
    ref: ClaimRef,
    claim: ResourceClaim,
    node: NodeContext,
    checkpoint: Checkpoint,
    boot_id: str,
    placement: UltraServerPlacement | None = None,
) -> ClaimPlan:
    """Decide how to prepare ``claim`` on ``node``; raises :class:`PrepareError`.

    Checks, in order: the claim is the one the kubelet means (same UID) and is allocated;
    its devices of this driver are in this node's pool and exist; its configs decode; no
    Neuron device it would hold is held by another claim in ``checkpoint`` (under the same
    name, or through the whole-node device). Devices allocated with admin access (a
    monitoring claim) hold nothing: they are prepared beside whoever holds them, and never
    keep another claim from a device.
    """
    if claim.metadata.uid != ref.uid:
        raise PrepareError(
            f"{ref}: UID is {claim.metadata.uid}, not {ref.uid} (the claim was recreated)"
        )
    allocation = claim.status.allocation
    if allocation is None:
        raise PrepareError(f"{ref}: not allocated")
    results = [r for r in allocation.devices.results if r.driver == node.driver]
    if not results:
        raise PrepareError(f"{ref}: no device of {node.driver} is allocated to it")

    requests_by_device: dict[str, list[str]] = {}
    # A device is held for admin access only when every request that got it asked for that.
    exclusive: set[str] = set()
    for i, result in enumerate(results):
        if result.pool != node.pool:
            raise PrepareError(
                f"{ref}: status.allocation.devices.results[{i}] is in pool {result.pool}, "
                f"not this node's pool {node.pool}"
            )
        if not result.admin_access:
            exclusive.add(result.device)
        names = requests_by_device.setdefault(result.device, [])
        if parent_request(result.request) not in names:
            names.append(parent_request(result.request))
    indices = {device: _indices(node, device, ref) for device in requests_by_device}

    try:
        configs = decode_configs(allocation.devices.config, driver=node.driver)
    except ConfigError as exc:
        raise PrepareError(f"{ref}: {exc}") from exc
    effective = [effective_config(configs, r.request) for r in results]
    requested_lnc = _single((e.logical_neuron_core for e in effective), "logicalNeuronCore", ref)
    us_nodes = _single((e.ultraserver_mode for e in effective), "ultraserverMode", ref)

    _refuse_overlaps(
        ref,
        node,
        checkpoint=checkpoint,
        wanted={d: held for d, held in indices.items() if d in exclusive},
    )

    all_indices = sorted({i for group in indices.values() for i in group})
    try:
        lnc = lnc_in_force(node.instance, requested=requested_lnc, node_default=node.default_lnc)
        us_env: tuple[str, ...] = ()
        if us_nodes is not None:
            if placement is None and us_nodes != 1:
                raise PrepareError(
                    f"{ref}: ultraserverMode {us_nodes}: this node's UltraServer placement is "
                    "not known yet"
                )
            where = placement or UltraServerPlacement(
                nodes=1, server_id="", node_id=0, topo_id=0, topo0_host=node.pool
            )
            if where.nodes != us_nodes:
                raise PrepareError(
                    f"{ref}: ultraserverMode {us_nodes} does not match the {where.nodes}-node "
                    "placement of this node"
                )
            us_env = ultraserver_env(where, supported_modes=node.supported_ultraserver_modes)
        edits = claim_edits(
            node.instance, all_indices, lnc=lnc, dev_root=node.dev_root, ultraserver=us_env
        )
    except EditsError as exc:
        raise PrepareError(f"{ref}: {exc}") from exc

    spec_devices: list[cdi.Device] = []
    prepared: list[PreparedDevice] = []
    for device, names in requests_by_device.items():
        cdi_name = cdi.claim_device_name(ref.uid, device)
        annotations = {
            ANNOTATION_DEVICE: f"{node.pool}/{device}",
            ANNOTATION_REQUESTS: ",".join(names),
        }
        if device not in exclusive:
            annotations[ANNOTATION_ADMIN_ACCESS] = "true"
        spec_devices.append(
            cdi.Device(
                name=cdi_name,
                container_edits=cdi.ContainerEdits(
                    device_nodes=tuple(edits.device_nodes[i] for i in indices[device])
                ),
                annotations=annotations,
            )
        )
        prepared.append(
            PreparedDevice(
                request_names=tuple(names),
                pool=node.pool,
                device=device,
                cdi_device_ids=(cdi.qualified_device_id(cdi_name, node.cdi_kind),),
                admin_access=device not in exclusive,
            )
        )
    spec = cdi.Spec(
        cdi_version=cdi.CDI_VERSION,
        kind=node.cdi_kind,
        devices=tuple(spec_devices),
        container_edits=cdi.ContainerEdits(env=edits.env),
        annotations={ANNOTATION_CLAIM: f"{ref.namespace}/{ref.name}/{ref.uid}"},
    )
    entry = ClaimEntry(
        uid=ref.uid,
        namespace=ref.namespace,
        name=ref.name,
        state=ClaimState.PREPARE_COMPLETED,
        boot_id=boot_id,
        devices=tuple(prepared),
    )
    return ClaimPlan(entry=entry, spec=spec)


def entry_from_spec(spec: cdi.Spec, *, boot_id: str) -> ClaimEntry | None:
    """Rebuild a completed checkpoint entry from a CDI spec this plugin wrote.

    Used when the checkpoint is lost or corrupted: the annotations carry what the entry
    held. ``None`` for a spec without them.
    """
    namespace, _, rest = spec.annotations.get(ANNOTATION_CLAIM, "").partition("/")
    name, _, uid = rest.partition("/")
    if not (namespace and name and uid):
        return None
    devices: list[PreparedDevice] = []
    for device in spec.devices:
        pool, _, device_name_ = device.annotations.get(ANNOTATION_DEVICE, "").partition("/")
        if not (pool and device_name_):
            return None
        requests = device.annotations.get(ANNOTATION_REQUESTS, "")
        devices.append(
            PreparedDevice(
                request_names=tuple(r for r in requests.split(",") if r),
                pool=pool,
                device=device_name_,
                cdi_device_ids=(cdi.qualified_device_id(device.name, spec.kind),),
                admin_access=device.annotations.get(ANNOTATION_ADMIN_ACCESS) == "true",
            )
        )
    return ClaimEntry(
        uid=uid,
        namespace=namespace,
        name=name,
        state=ClaimState.PREPARE_COMPLETED,
        boot_id=boot_id,
        devices=tuple(devices),
    )
