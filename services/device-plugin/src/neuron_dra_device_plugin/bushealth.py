"""Device health from the bus: this node's ``DeviceHealthChanged`` events, as the health
monitor publishes them (an uncorrectable or degraded device is Unhealthy until its repair).

At every start the latest event per device is replayed (``last_per_subject``), so a restart
never forgets that a device is unhealthy. The bus client is loaded only when :meth:`follow`
runs: the kubelet's calls are served from start, with or without NATS.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

from neuron_dra_common.driver import device_name
from neuron_dra_common.events import AnyEvent, DeviceHealthChanged
from neuron_dra_common.events.base import SUBJECT_ROOT, subject_token

from neuron_dra_device_plugin.health import HealthState

if TYPE_CHECKING:
    from neuron_dra_common.bus import Bus, Follower

__all__ = ["READER", "SOURCE", "BusHealthFeed"]

#: Whose dead letters this node's refused health events are.
READER: Final = "device-plugin-health"
#: The name of this source in :class:`HealthState`.
SOURCE: Final = "health-events"


class BusHealthFeed:
    """Applies this node's health events to ``state``."""

    def __init__(self, *, node: str, devices: Iterable[int], state: HealthState) -> None:
        self._node = node
        self._index = {device_name(d): d for d in devices}
        self._state = state
        self._latest: dict[int, str] = {}
        self._stop = asyncio.Event()
        self._follower: Follower | None = None
        self.applied = 0

    def apply(self, event: DeviceHealthChanged) -> bool:
        """Take one event into account; ``False`` if it is not about a device of this node."""
        index = self._index.get(event.device)
        if event.node != self._node or index is None:
            return False
        self._latest[index] = event.health
        # Unknown is no news: the kubelet knows only Healthy and Unhealthy.
        self._state.update(
            SOURCE, frozenset(d for d, h in self._latest.items() if h == "Unhealthy")
        )
        self.applied += 1
        return True

    def _on_event(self, event: AnyEvent) -> None:
        if isinstance(event, DeviceHealthChanged):
            self.apply(event)

    def stop(self) -> None:
        self._stop.set()
        if self._follower is not None:
            self._follower.stop()

    async def follow(self, bus: Bus) -> None:
        """Apply this node's health events, latest per device first, until :meth:`stop`."""
        from neuron_dra_common.bus import Follower
        from neuron_dra_common.bus.declarations import HEALTH

        self._follower = Follower(
            bus,
            name=READER,
            stream=HEALTH.name,
            subject=f"{SUBJECT_ROOT}.health.{subject_token(self._node)}.>",
            handler=self._on_event,
            last_per_subject=True,
        )
        if not self._stop.is_set():
            await self._follower.run()
