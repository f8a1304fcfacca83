"""Container edits for a claim's Neuron devices: device nodes and Neuron runtime variables.

Pure functions. Per-instance facts (logical cores per device, whether LNC applies) come from
the instance catalog in :mod:`neuron_dra_common.topology`.

- ``/dev/neuronN`` for every device (the host path may live under another root, as on a
  simulated node);
- ``NEURON_RT_VISIBLE_CORES``: host-global logical core ids of the claim's devices at the
  LNC in force, as ranges (``4-7,12-15``): device ``d`` owns ``d*k .. d*k+k-1`` where ``k``
  is its logical core count;
- ``NEURON_LOGICAL_NC_CONFIG`` on instances with an LNC setting (trn2, trn3);
- the UltraServer variables, from an explicit :class:`UltraServerPlacement`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence

import msgspec
from neuron_dra_common.cdi import DeviceNode
from neuron_dra_common.topology import InstanceSpec, logical_cores_per_device
from neuron_dra_common.topology.cores import format_ranges, visible_cores

__all__ = [
    "MODE_FOUR_NODE",
    "MODE_SINGLE_NODE",
    "MODE_TWO_NODE_HORIZONTAL",
    "MODE_TWO_NODE_VERTICAL",
    "ClaimEdits",
    "EditsError",
    "UltraServerPlacement",
    "claim_edits",
    "device_node",
    "format_ranges",
    "lnc_in_force",
    "ultraserver_env",
    "ultraserver_mode_enum",
    "visible_cores",
]

# The driver's ultraserver_mode enum (what NEURON_RT_ULTRASERVER_MODE carries).
MODE_FOUR_NODE = 1
MODE_TWO_NODE_HORIZONTAL = 2
MODE_TWO_NODE_VERTICAL = 3
MODE_SINGLE_NODE = 4


class EditsError(ValueError):
    """The edits cannot be built (a setting the instance does not support, a bad placement)."""


def lnc_in_force(
    spec: InstanceSpec, *, requested: int | None, node_default: int | None
) -> int | None:
    """The LNC a claim runs with: its config, else the node's, else the instance default.

    ``None`` on instances without an LNC setting. Raises :class:`EditsError` when the value
    is not one the instance supports.
    """
    if spec.default_lnc is None:
        if requested not in (None, 1):
            raise EditsError(
                f"logicalNeuronCore: instance type {spec.name} has no logical NeuronCore setting"
            )
        return None
    value = requested or node_default or spec.default_lnc
    if value not in spec.supported_lnc:
        allowed = ", ".join(str(v) for v in spec.supported_lnc)
        raise EditsError(
            f"logicalNeuronCore: {value} is not one of {allowed} on instance type {spec.name}"
        )
    return value


def device_node(index: int, *, dev_root: str | os.PathLike[str] = "/dev") -> DeviceNode:
    """The CDI device node of ``/dev/neuron<index>``, taken from ``dev_root`` on the host."""
    return _device_node(index, os.fspath(dev_root))


@functools.lru_cache(maxsize=1024)
def _device_node(index: int, dev_root: str) -> DeviceNode:
    # A node has a few dozen devices and one dev root: every claim's nodes are made once.
    path = f"/dev/neuron{index}"
    host = os.path.join(dev_root, f"neuron{index}")
    return DeviceNode(path=path, host_path=None if host == path else host)


class UltraServerPlacement(msgspec.Struct, frozen=True, kw_only=True):
    """Where this node sits in an UltraServer job (fed by the UltraServer operator).

    ``nodes`` is the user-facing size (1, 2, 4); ``server_id`` the driver's server id for
    that size; ``node_id`` this node's id within it; ``topo_id`` its 0-based rank in the job
    (``ultraserverIndex * nodeCount + nodeIndex``) and ``topo0_host`` the rank-0 node.
    """

    nodes: int
    server_id: str
    node_id: int
    topo_id: int
    topo0_host: str
    #: The driver's mode enum the allocator chose (a horizontal pair is mode 2 even where
    #: vertical links work); 0: derive it from ``nodes`` and the node's supported modes.
    mode: int = 0


def ultraserver_mode_enum(nodes: int, supported_modes: Sequence[int]) -> int:
    """The driver's mode enum for a user-facing node count.

    Two nodes prefer the vertical pairing and fall back to horizontal; an empty
    ``supported_modes`` means the driver did not say, and every mode is assumed.

    >>> ultraserver_mode_enum(2, [1, 3, 4])
    3
    >>> ultraserver_mode_enum(2, [2, 4])
    2
    """
    candidates = {
        1: (MODE_SINGLE_NODE,),
        2: (MODE_TWO_NODE_VERTICAL, MODE_TWO_NODE_HORIZONTAL),
        4: (MODE_FOUR_NODE,),
    }.get(nodes)
    if candidates is None:
        raise EditsError(f"ultraserverMode: {nodes} is not one of 1, 2, 4")
    for mode in candidates:
        if not supported_modes or mode in supported_modes:
            return mode
    supported = ", ".join(str(m) for m in supported_modes)
    raise EditsError(
        f"ultraserverMode: {nodes} nodes are not available on this node (the driver supports "
        f"modes {supported}; a missing mode means broken NeuronLinks)"
    )


def ultraserver_env(
    placement: UltraServerPlacement, *, supported_modes: Sequence[int]
) -> tuple[str, ...]:
    """The ``NEURON_RT_ULTRASERVER_*`` and ``NEURON_GLOBAL_TOPOID*`` variables of a placement."""
    if placement.topo_id < 0:
        raise EditsError(f"UltraServer placement: topo id {placement.topo_id} is negative")
    mode = placement.mode or ultraserver_mode_enum(placement.nodes, supported_modes)
    return (
        f"NEURON_RT_ULTRASERVER_MODE={mode}",
        f"NEURON_RT_ULTRASERVER_SERVER_ID={placement.server_id}",
        f"NEURON_RT_ULTRASERVER_NODE_ID={placement.node_id}",
        f"NEURON_GLOBAL_TOPOID={placement.topo_id}",
        f"NEURON_GLOBAL_TOPOID0_HOST={placement.topo0_host}",
    )


class ClaimEdits(msgspec.Struct, frozen=True, kw_only=True):
    """Edits of one claim: a device node per device, and the claim-wide environment."""

    device_nodes: dict[int, DeviceNode]
    env: tuple[str, ...]


def claim_edits(
    spec: InstanceSpec,
    devices: Sequence[int],
    *,
    lnc: int | None,
    dev_root: str | os.PathLike[str] = "/dev",
    ultraserver: tuple[str, ...] = (),
) -> ClaimEdits:
    """Build the edits for ``devices`` of an ``spec`` node at ``lnc`` (from :func:`lnc_in_force`).

    >>> from neuron_dra_common.topology import instance_spec
    >>> claim_edits(instance_spec("trn2.48xlarge"), [0, 1], lnc=1).env
    ('NEURON_RT_VISIBLE_CORES=0-15', 'NEURON_LOGICAL_NC_CONFIG=1')
    """
    if not devices:
        raise EditsError("a claim without devices has no edits")
    try:
        per_device = logical_cores_per_device(spec, lnc)
    except ValueError as exc:
        raise EditsError(f"logicalNeuronCore: {exc}") from exc
    env = [f"NEURON_RT_VISIBLE_CORES={visible_cores(devices, per_device)}"]
    if spec.default_lnc is not None:
        env.append(f"NEURON_LOGICAL_NC_CONFIG={lnc or spec.default_lnc}")
    env.extend(ultraserver)
    return ClaimEdits(
        device_nodes={d: device_node(d, dev_root=dev_root) for d in sorted(set(devices))},
        env=tuple(env),
    )
