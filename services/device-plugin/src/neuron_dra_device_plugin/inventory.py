"""What the plugin offers the kubelet for each resource: device and core ids. Pure.

Whole devices (``aws.amazon.com/neuron`` and its older name ``aws.amazon.com/neurondevice``)
are listed as ``neuron<N>``; NeuronCores (``aws.amazon.com/neuroncore``) as ``neuroncore<C>``
with ``C`` the host-global logical core id the Neuron runtime reads in
``NEURON_RT_VISIBLE_CORES`` (device ``d`` owns ``d*k .. d*k+k-1`` at ``k`` cores per device).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec
from neuron_dra_common.extended import CORE_RESOURCE, MANAGED_RESOURCES
from neuron_dra_common.topology import InstanceSpec, device_cores

__all__ = ["CORE_PREFIX", "DEVICE_PREFIX", "Inventory", "UnknownId", "unit_name"]

DEVICE_PREFIX = "neuron"
CORE_PREFIX = "neuroncore"


class UnknownId(ValueError):
    """The kubelet named an id this plugin never listed for the resource."""


class Inventory(msgspec.Struct, frozen=True, kw_only=True):
    """The node's Neuron devices as the plugin serves them.

    ``instance_type`` is the name as the node reports it (refusals quote it); ``numa`` maps a
    device to its NUMA node where known (the kubelet's topology manager aligns with it).
    """

    instance_type: str
    spec: InstanceSpec
    devices: tuple[int, ...]
    cores_per_device: int
    #: The logical NeuronCore config in force where the instance has one (trn2, trn3).
    lnc: int | None = None
    numa: Mapping[int, int] = msgspec.field(default_factory=dict)

    def cores(self, devices: Iterable[int] | None = None) -> tuple[int, ...]:
        """The core ids of ``devices`` (all the node's devices by default), ascending."""
        chosen = self.devices if devices is None else devices
        return tuple(sorted(c for d in set(chosen) for c in device_cores(d, self.cores_per_device)))

    def device_of(self, core: int) -> int:
        return core // self.cores_per_device

    def units(self, resource: str) -> tuple[int, ...]:
        """What ``resource`` counts on this node: device indices, or core ids."""
        return self.cores() if resource == CORE_RESOURCE else self.devices

    def ids(self, resource: str) -> tuple[str, ...]:
        """The device-plugin ids of ``resource``, in unit order."""
        return tuple(unit_name(resource, u) for u in self.units(resource))

    def parse(self, resource: str, ids: Iterable[str]) -> tuple[int, ...]:
        """Units from device-plugin ids, ascending; :class:`UnknownId` names the first bad one.

        >>> from neuron_dra_common.topology import instance_spec
        >>> inv = Inventory(instance_type="inf2.xlarge", spec=instance_spec("inf2.xlarge"),
        ...                 devices=(0,), cores_per_device=2)
        >>> inv.parse("aws.amazon.com/neuroncore", ["neuroncore1", "neuroncore0"])
        (0, 1)
        """
        prefix = CORE_PREFIX if resource == CORE_RESOURCE else DEVICE_PREFIX
        known = set(self.units(resource))
        out: set[int] = set()
        for raw in ids:
            number = raw.removeprefix(prefix)
            if number == raw or not number.isdigit() or int(number) not in known:
                raise UnknownId(f"resource {resource}: id {raw!r} is not one of this node's")
            out.add(int(number))
        return tuple(sorted(out))


def unit_name(resource: str, unit: int) -> str:
    """The device-plugin id of device or core ``unit``.

    >>> unit_name("aws.amazon.com/neuron", 3), unit_name("aws.amazon.com/neuroncore", 12)
    ('neuron3', 'neuroncore12')
    """
    if resource not in MANAGED_RESOURCES:
        raise ValueError(f"resource {resource!r} is not one of {', '.join(MANAGED_RESOURCES)}")
    return f"{CORE_PREFIX if resource == CORE_RESOURCE else DEVICE_PREFIX}{unit}"
