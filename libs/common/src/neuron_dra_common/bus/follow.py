"""Projections: replay a stream into memory from its first message, then follow it, in order.

A service that keeps its state in memory (the topology allocator's view of the fleet, the
kubelet plugin's device health, the slice publisher's inventories at start) must rebuild it
after a restart, so it reads with an ordered consumer from the beginning instead of a durable
consumer that remembers what was already acknowledged. This is the one way the product
replays a stream. :attr:`Follower.caught_up` tells when everything stored before the start
has been applied, so the service answers only from a complete view; :func:`replay` reads
what is stored once and returns it.

>>> follower = Follower(bus, stream="NEURON_INVENTORY", subject="neuron.inventory.>",
...                     handler=projection.apply)
>>> service.add_task("inventory", follower.run, stop=follower.stop,
...                  ready=lambda: follower.caught_up)
>>> inventories = await replay(bus, stream="NEURON_INVENTORY", subject="neuron.inventory.>")
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable

import nats.errors
from nats.js import api

from neuron_dra_common.bus.connection import Bus
from neuron_dra_common.events.codec import AnyEvent, DecodeError, decode

__all__ = ["Follower", "ProjectionHandler", "replay"]

log = logging.getLogger(__name__)

ProjectionHandler = Callable[[AnyEvent], Awaitable[None] | None]


class Follower:
    """Applies every event of ``subject`` in ``stream`` to ``handler``, from the first one.

    With ``last_per_subject`` it starts at the latest event of each subject instead (what a
    projection of "the current state of each thing" needs); with ``once`` it returns as soon
    as it caught up, rather than following what comes next.
    """

    def __init__(
        self,
        bus: Bus,
        *,
        stream: str,
        subject: str,
        handler: ProjectionHandler,
        last_per_subject: bool = False,
        once: bool = False,
    ) -> None:
        self._bus = bus
        self._stream = stream
        self._subject = subject
        self._handler = handler
        self._deliver = (
            api.DeliverPolicy.LAST_PER_SUBJECT if last_per_subject else api.DeliverPolicy.ALL
        )
        self._once = once
        self._caught_up = asyncio.Event()
        self._stop = asyncio.Event()
        self.applied = 0

    @property
    def caught_up(self) -> bool:
        return self._caught_up.is_set()

    async def wait_caught_up(self) -> None:
        await self._caught_up.wait()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        sub = await self._bus.js.subscribe(
            self._subject,
            stream=self._stream,
            ordered_consumer=True,
            deliver_policy=self._deliver,
        )
        try:
            info = await sub.consumer_info()
            if info.num_pending == 0 and (info.delivered is None or not info.delivered.stream_seq):
                self._caught_up.set()
            while not self._stop.is_set() and not (self._once and self.caught_up):
                try:
                    msg = await sub.next_msg(timeout=0.5)
                except (nats.errors.TimeoutError, TimeoutError):
                    continue
                try:
                    event = decode(msg.data)
                except DecodeError as exc:
                    # A projection skips what it cannot read; the audit stream keeps it.
                    log.error("projection skipped a message", extra={"error": str(exc)})
                else:
                    result = self._handler(event)
                    if inspect.isawaitable(result):
                        await result
                    self.applied += 1
                if msg.metadata.num_pending == 0:
                    self._caught_up.set()
        finally:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()


async def replay(
    bus: Bus, *, stream: str, subject: str, last_per_subject: bool = False
) -> list[AnyEvent]:
    """Every event of ``subject`` stored in ``stream`` now, in order (undecodable ones skipped).

    >>> stored = await replay(bus, stream=INVENTORY.name, subject="neuron.inventory.>")
    """
    events: list[AnyEvent] = []
    follower = Follower(
        bus,
        stream=stream,
        subject=subject,
        handler=events.append,
        last_per_subject=last_per_subject,
        once=True,
    )
    await follower.run()
    return events
