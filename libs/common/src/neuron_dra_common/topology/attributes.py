"""Topology attribute values a node publishes for each device.

A DRA claim asks for connected devices with ``matchAttribute`` over a *group attribute*: every
device of one group carries the same value, and every group is a connected set (see
:mod:`neuron_dra_common.topology.connected`). What is published:

* **torus** (trn1, trn1n, trn2, trn2u), as AWS's driver: ``topology_x`` = row,
  ``topology_y`` = column, ``topology4_id`` = row, ``topology8_id`` = pair of rows.
* **ring / line / all-to-all** (inf1, inf2, Trn3): ``topology2_id``, ``topology4_id`` and
  ``topology8_id`` = ``deviceId // N`` where the node has at least N devices. These aligned
  groups are contiguous id ranges, hence connected, so ``count: 2`` with ``matchAttribute:
  neuron.aws.com/topology2_id`` receives a linked pair. What DRA cannot express is an
  arbitrary window (``[1, 2]``, or a wrapping ``[11, 0]`` on inf2.48xlarge): ``matchAttribute``
  only compares equal values, so only fixed, aligned groups can be asked for. Unaligned windows
  are the scheduler extender's job (:func:`~neuron_dra_common.topology.connected.connected_sets`).
  The last group may be short (``topology8_id`` 1 on inf2.48xlarge is devices 8-11).
* ``resource.aws.com/devicegroup{1,4,8,16}_id``, with AWS's algorithm, so that one
  ``matchAttribute`` spans Neuron and EFA devices: the group of device ``d`` is ``d // N``;
  ``devicegroup1_id`` is the device's EFA PCI address; for N in 4, 8, 16 it is the first 16
  hex characters of the SHA-256 of the group's EFA addresses, de-duplicated, sorted and joined
  with ``,``. Only where the catalog has an EFA map (trn2, trn2u); elsewhere nothing.

Names of attributes in the driver's own domain are bare (``topology_x``); the devicegroup
names carry their domain.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from neuron_dra_common.topology.adjacency import torus_column, torus_row
from neuron_dra_common.topology.catalog import InstanceSpec, LinkTopology, instance_spec

__all__ = [
    "DEVICEGROUP_DOMAIN",
    "DEVICEGROUP_SIZES",
    "AttributeValue",
    "attribute_groups",
    "device_attributes",
    "devicegroup_attribute",
    "devicegroup_id",
    "group_attribute_names",
    "node_attributes",
]

AttributeValue = int | str

DEVICEGROUP_DOMAIN = "resource.aws.com"
DEVICEGROUP_SIZES = (1, 4, 8, 16)
_ALIGNED_SIZES = (2, 4, 8)

TOPOLOGY_X = "topology_x"
TOPOLOGY_Y = "topology_y"


def devicegroup_attribute(size: int) -> str:
    """The fully qualified name of the device group attribute of ``size`` devices."""
    return f"{DEVICEGROUP_DOMAIN}/devicegroup{size}_id"


def _topology_group(size: int) -> str:
    return f"topology{size}_id"


def devicegroup_id(efa_map: Sequence[str], *, device: int, size: int) -> str:
    """AWS's ``devicegroup{size}_id`` of ``device`` given the node's EFA map.

    >>> devicegroup_id(["0000:c9:00.0"], device=0, size=1)
    '0000:c9:00.0'
    """
    if not 0 <= device < len(efa_map):
        raise ValueError(f"EFA map of {len(efa_map)} entries has no entry for device {device}")
    if size == 1:
        return efa_map[device]
    first = (device // size) * size
    members = sorted(set(efa_map[first : first + size]))
    return hashlib.sha256(",".join(members).encode()).hexdigest()[:16]


def _resolve(instance: InstanceSpec | str) -> InstanceSpec:
    return instance if isinstance(instance, InstanceSpec) else instance_spec(instance)


def group_attribute_names(instance: InstanceSpec | str) -> tuple[str, ...]:
    """The attributes of ``instance`` whose equal values mark one connected group."""
    spec = _resolve(instance)
    names: list[str] = []
    if spec.topology is LinkTopology.TORUS4X4:
        names += [_topology_group(4), _topology_group(8)]
    elif spec.topology is not LinkTopology.NONE:
        names += [_topology_group(n) for n in _ALIGNED_SIZES if spec.devices >= n]
    if spec.efa_map is not None:
        names += [devicegroup_attribute(n) for n in DEVICEGROUP_SIZES]
    return tuple(names)


def device_attributes(instance: InstanceSpec | str, device: int) -> dict[str, AttributeValue]:
    """Every topology attribute of ``device`` on ``instance``, by attribute name.

    >>> device_attributes("trn2.48xlarge", 5)["topology8_id"]
    0
    """
    spec = _resolve(instance)
    if not 0 <= device < spec.devices:
        raise ValueError(f"instance type {spec.name} has no device {device}")
    attrs: dict[str, AttributeValue] = {}
    if spec.topology is LinkTopology.TORUS4X4:
        row = torus_row(device)
        attrs[TOPOLOGY_X] = row
        attrs[TOPOLOGY_Y] = torus_column(device)
        attrs[_topology_group(4)] = row
        attrs[_topology_group(8)] = row // 2
    elif spec.topology is not LinkTopology.NONE:
        for n in _ALIGNED_SIZES:
            if spec.devices >= n:
                attrs[_topology_group(n)] = device // n
    if spec.efa_map is not None:
        for n in DEVICEGROUP_SIZES:
            attrs[devicegroup_attribute(n)] = devicegroup_id(spec.efa_map, device=device, size=n)
    return attrs


def node_attributes(instance: InstanceSpec | str) -> tuple[dict[str, AttributeValue], ...]:
    """:func:`device_attributes` of every device of ``instance``, indexed by device id."""
    spec = _resolve(instance)
    return tuple(device_attributes(spec, d) for d in range(spec.devices))


def attribute_groups(
    instance: InstanceSpec | str, attribute: str
) -> dict[AttributeValue, tuple[int, ...]]:
    """The devices sharing each value of ``attribute`` on ``instance``, ascending.

    >>> attribute_groups("trn2.48xlarge", "topology8_id")[1]
    (8, 9, 10, 11, 12, 13, 14, 15)
    """
    groups: dict[AttributeValue, list[int]] = {}
    for device, attrs in enumerate(node_attributes(instance)):
        if attribute in attrs:
            groups.setdefault(attrs[attribute], []).append(device)
    return {value: tuple(members) for value, members in groups.items()}
