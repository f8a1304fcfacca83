"""Device health as the kubelet's device manager reads it, and where it comes from.

A device is ``Unhealthy`` when the node no longer shows it (its sysfs directory or its
``/dev/neuronN`` node is gone: a driver that lost the device, a device taken away), or when
the health monitor's latest ``DeviceHealthChanged`` for it says Unhealthy (see
:mod:`.bushealth`). Its cores are unhealthy with it. The kubelet takes unhealthy devices out of the node's allocatable
count; a pod already holding one keeps running.

:func:`unhealthy_devices` and :func:`unit_health` are pure; :class:`HealthState` holds the
current view and wakes the ``ListAndWatch`` streams on a change; :class:`PresenceProbe`
looks at the node's files.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from neuron_dra_common.extended import CORE_RESOURCE
from neuron_dra_common.hardware.layout import NodePaths

from neuron_dra_device_plugin.inventory import Inventory

__all__ = [
    "HEALTHY",
    "UNHEALTHY",
    "HealthState",
    "PresenceProbe",
    "unhealthy_devices",
    "unit_health",
]

HEALTHY: Final = "Healthy"
UNHEALTHY: Final = "Unhealthy"


def unhealthy_devices(
    devices: Iterable[int], *, in_sysfs: Iterable[int], with_node: Iterable[int]
) -> frozenset[int]:
    """The ``devices`` missing from sysfs or without a device node.

    >>> sorted(unhealthy_devices([0, 1, 2], in_sysfs=[0, 1], with_node=[0, 2]))
    [1, 2]
    """
    seen = frozenset(in_sysfs) & frozenset(with_node)
    return frozenset(d for d in devices if d not in seen)


def unit_health(
    inventory: Inventory, *, resource: str, unhealthy: frozenset[int]
) -> tuple[tuple[int, str], ...]:
    """``(unit, Healthy|Unhealthy)`` for every unit of ``resource``; a core follows its device.

    >>> from neuron_dra_common.topology import instance_spec
    >>> inv = Inventory(instance_type="inf2.xlarge", spec=instance_spec("inf2.xlarge"),
    ...                 devices=(0,), cores_per_device=2)
    >>> unit_health(inv, resource="aws.amazon.com/neuroncore", unhealthy=frozenset({0}))
    ((0, 'Unhealthy'), (1, 'Unhealthy'))
    """
    out: list[tuple[int, str]] = []
    for unit in inventory.units(resource):
        device = inventory.device_of(unit) if resource == CORE_RESOURCE else unit
        out.append((unit, UNHEALTHY if device in unhealthy else HEALTHY))
    return tuple(out)


class HealthState:
    """The unhealthy devices of the node, as several sources report them (a device is
    unhealthy while any source says so), and an event per change for the streams."""

    def __init__(self) -> None:
        self._by_source: dict[str, frozenset[int]] = {}
        self._unhealthy: frozenset[int] = frozenset()
        self._changed = asyncio.Event()

    @property
    def unhealthy(self) -> frozenset[int]:
        return self._unhealthy

    def update(self, source: str, unhealthy: frozenset[int]) -> bool:
        """Take ``source``'s new view; True when the node's unhealthy devices changed."""
        self._by_source[source] = unhealthy
        combined = frozenset().union(*self._by_source.values())
        if combined == self._unhealthy:
            return False
        self._unhealthy = combined
        # Wake every waiting stream, then arm again for the next change.
        self._changed.set()
        self._changed = asyncio.Event()
        return True

    def next_change(self) -> asyncio.Event:
        """Set on the next change after now (take it before reading :attr:`unhealthy`)."""
        return self._changed


class PresenceProbe:
    """Which of the node's devices it still shows, read under ``host_root``."""

    def __init__(self, *, host_root: Path, devices: Iterable[int]) -> None:
        self._paths = NodePaths(host_root)
        self._devices = tuple(devices)

    def unhealthy(self) -> frozenset[int]:
        return unhealthy_devices(
            self._devices,
            in_sysfs=[d for d in self._devices if self._paths.device(d).is_dir()],
            with_node=[d for d in self._devices if self._paths.dev_node(d).exists()],
        )
