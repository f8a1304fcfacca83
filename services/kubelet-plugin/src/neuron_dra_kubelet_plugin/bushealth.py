"""Device health from the bus: this node's ``DeviceHealthChanged`` events feed the stream.

Until a health event says otherwise, every device discovery sees is healthy. At every start
the plugin reads the latest event per device again (an ephemeral, ordered consumer that
starts at the last message of each subject), so a restart never forgets that a device is
unhealthy; a durable consumer would resume after what it acknowledged and forget exactly
that.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Final

from nats.js import JetStreamContext, api
from neuron_dra_common.bus.declarations import HEALTH
from neuron_dra_common.events import DeviceHealthChanged
from neuron_dra_common.events.base import SUBJECT_ROOT, subject_token
from neuron_dra_common.events.codec import DecodeError, decode

from neuron_dra_kubelet_plugin.health import DeviceHealthReport, Health, StaticHealth

__all__ = ["BusHealth", "health_subject"]

log = logging.getLogger(__name__)

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
    >>> task = asyncio.create_task(health.follow(bus.js), name="health")
    """

    def __init__(self, *, node: str, pool: str, devices: Iterable[str]) -> None:
        self._devices = frozenset(devices)
        super().__init__(pool=pool, devices=sorted(self._devices))
        self._node = node
        self._pool = pool
        self._stop = asyncio.Event()
        self.applied = 0

    def apply(self, event: DeviceHealthChanged) -> bool:
        """Take one event into account; ``False`` if it is not about a device of this node."""
        if event.node != self._node or event.device not in self._devices:
            return False
        observed = event.observed_at.timestamp() if event.observed_at else time.time()
        message = event.reason
        if event.error_code:
            message = f"{event.error_code}: {message}" if message else event.error_code
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

    async def follow(self, js: JetStreamContext) -> None:
        """Apply this node's health events, latest per device first, until :meth:`stop`."""
        sub = await js.subscribe(
            health_subject(self._node),
            stream=HEALTH.name,
            ordered_consumer=True,
            deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT,
        )
        try:
            while not self._stop.is_set():
                try:
                    msg = await sub.next_msg(timeout=1.0)
                except TimeoutError:
                    continue
                try:
                    event = decode(msg.data)
                except DecodeError as exc:
                    log.warning(
                        "undecodable health event",
                        extra={"subject": msg.subject, "error": str(exc)},
                    )
                    continue
                if isinstance(event, DeviceHealthChanged):
                    self.apply(event)
        finally:
            await sub.unsubscribe()
