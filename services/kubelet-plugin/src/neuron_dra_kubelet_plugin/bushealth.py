"""Device health from the bus: this node's ``DeviceHealthChanged`` events feed the stream.

Until a health event says otherwise, every device discovery sees is healthy. At every start
the plugin replays the latest event per device (the bus's :class:`Follower`, starting at the
last message of each subject), so a restart never forgets that a device is unhealthy; a
durable consumer would resume after what it acknowledged and forget exactly that.

The bus client is loaded only when :meth:`BusHealth.follow` runs: the health stream the kubelet
reads is served from start, and loading NATS's client does not delay the plugin's
registration.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

from neuron_dra_common.events import AnyEvent, DeviceHealthChanged
from neuron_dra_common.events.base import SUBJECT_ROOT, subject_token

from neuron_dra_kubelet_plugin.health import DeviceHealthReport, Health, StaticHealth

if TYPE_CHECKING:
    from neuron_dra_common.bus import Bus, Follower

__all__ = ["READER", "BusHealth", "health_subject"]

log = logging.getLogger(__name__)

#: Whose dead letters this node's refused health events are (each node reads only its own).
READER: Final = "kubelet-plugin-health"

_HEALTH: Final = {
    "Healthy": Health.HEALTHY,
    "Unhealthy": Health.UNHEALTHY,
    "Unknown": Health.UNKNOWN,
}


def health_subject(node: str) -> str:
    """The subjects of this node's device health events."""
    return f"{SUBJECT_ROOT}.health.{subject_token(node)}.>"


class BusHealth(StaticHealth):
    """The node's devices, healthy until the bus reports otherwise.

    >>> health = BusHealth(node="ip-1", pool="ip-1", devices=["neurondevice0"])
    >>> task = asyncio.create_task(health.follow(bus), name="health")
    """

    def __init__(self, *, node: str, pool: str, devices: Iterable[str]) -> None:
        self._devices = frozenset(devices)
        super().__init__(pool=pool, devices=sorted(self._devices))
        self._node = node
        self._pool = pool
        self._stop = asyncio.Event()
        self._follower: Follower | None = None
        self.applied = 0

    def apply(self, event: DeviceHealthChanged) -> bool:
        """Take one event into account; ``False`` if it is not about a device of this node."""
        if event.node != self._node or event.device not in self._devices:
            return False
        observed = event.observed_at.timestamp() if event.observed_at else time.time()
        message = event.reason
        if event.error_code:
            message = f"{event.error_code}: {message}" if message else event.error_code
        if event.severity:
            # What the kubelet shows in the pod's allocatedResourcesStatus: how bad, what to
            # do, and the proof (the kernel line or counter delta).
            message = f"{event.severity}: {message}" if message else event.severity
        if event.evidence:
            message = f"{message}; evidence: {event.evidence}"
        self.update(
            DeviceHealthReport(
                pool=self._pool,
                device=event.device,
                health=_HEALTH.get(event.health, Health.UNKNOWN),
                updated_at=int(observed),
                message=message,
            )
        )
        self.applied += 1
        return True

    def stop(self) -> None:
        self._stop.set()
        if self._follower is not None:
            self._follower.stop()

    def _on_event(self, event: AnyEvent) -> None:
        if isinstance(event, DeviceHealthChanged):
            self.apply(event)

    def follower(self, bus: Bus) -> Follower:
        """The reader of this node's health events (refused ones go to its dead letter)."""
        from neuron_dra_common.bus import Follower
        from neuron_dra_common.bus.declarations import HEALTH

        return Follower(
            bus,
            name=READER,
            stream=HEALTH.name,
            subject=health_subject(self._node),
            handler=self._on_event,
            last_per_subject=True,
        )

    async def follow(self, bus: Bus) -> None:
        """Apply this node's health events, latest per device first, until :meth:`stop`."""
        self._follower = self.follower(bus)
        if not self._stop.is_set():
            await self._follower.run()
