"""Projections: replay a stream into memory from its first message, then follow it, in order.

A service that keeps its state in memory (the topology allocator's view of the fleet, the
kubelet plugin's device health, the slice publisher's inventories at start) must rebuild it
after a restart, so it reads with an ordered consumer from the beginning instead of a durable
consumer that remembers what was already acknowledged. This is the one way the product
replays a stream. :attr:`Follower.caught_up` tells when everything stored before the start
has been applied, so the service answers only from a complete view; :func:`replay` reads
what is stored once and returns it.

A message :func:`~.intake.admit` refuses, or one the handler raises on, goes to the dead
letter of the reader's ``name`` with the reason, and the projection goes on with the next:
its handler is in-memory and deterministic, so another try would fail the same way. Reading
the stream again at the next start stores the same dead letter once (its id is stable and the
dead-letter stream remembers ids as long as it keeps them).

>>> follower = Follower(bus, name="topology-allocator-inventory", stream="NEURON_INVENTORY",
...                     subject="neuron.inventory.>", handler=projection.apply)
>>> service.add_task("inventory", follower.run, stop=follower.stop,
...                  ready=lambda: follower.caught_up)
>>> inventories = await replay(bus, name="slice-publisher-inventory",
...                            stream="NEURON_INVENTORY", subject="neuron.inventory.>")
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable

import nats.errors
from nats.aio.msg import Msg
from nats.js import api

from neuron_dra_common.bus.connection import Bus
from neuron_dra_common.bus.deadletter import DeadLetterKind, publish_dead_letter
from neuron_dra_common.bus.declarations import published_subject, reader
from neuron_dra_common.bus.errors import PermanentError
from neuron_dra_common.bus.intake import Refused, admit
from neuron_dra_common.events.codec import AnyEvent

__all__ = ["Follower", "ProjectionHandler", "nothing_to_read", "replay"]

log = logging.getLogger(__name__)

#: Pause before storing a dead letter again while JetStream does not answer.
_DEAD_LETTER_RETRY = 1.0

ProjectionHandler = Callable[[AnyEvent], Awaitable[None] | None]


class Follower:
    """Applies every event of ``subject`` in ``stream`` to ``handler``, from the first one.

    With ``last_per_subject`` it starts at the latest event of each subject instead (what a
    projection of "the current state of each thing" needs); with ``once`` it returns as soon
    as it caught up, rather than following what comes next. ``name`` says whose dead letters
    the refused messages are.
    """

    def __init__(
        self,
        bus: Bus,
        *,
        name: str,
        stream: str,
        subject: str,
        handler: ProjectionHandler,
        last_per_subject: bool = False,
        once: bool = False,
    ) -> None:
        self._bus = bus
        #: Whose dead letters the refused messages are.
        self.name = name
        self._spec = reader(stream, name)
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
        self.dead_lettered = 0

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
            if nothing_to_read(await sub.consumer_info()):
                self._caught_up.set()
            while not self._stop.is_set() and not (self._once and self.caught_up):
                try:
                    msg = await sub.next_msg(timeout=0.5)
                except (nats.errors.TimeoutError, TimeoutError):
                    continue
                await self._take(msg)
                if msg.metadata.num_pending == 0:
                    self._caught_up.set()
        finally:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()

    async def _take(self, msg: Msg) -> None:
        """Apply one message, or store it as a dead letter with the reason."""
        try:
            event = admit(msg.data, subject=msg.subject, limits=self._bus.limits)
        except Refused as exc:
            await self._dead_letter(msg, kind=exc.kind, reason=str(exc))
            return
        try:
            result = self._handler(event)
            if inspect.isawaitable(result):
                await result
        except asyncio.CancelledError:
            raise
        except PermanentError as exc:
            await self._dead_letter(msg, kind="permanent", reason=str(exc))
            return
        except Exception as exc:
            log.exception("projection handler failed", extra={"reader": self._spec.durable})
            await self._dead_letter(msg, kind="handler", reason=f"handler raised {exc!r}")
            return
        self.applied += 1

    async def _dead_letter(self, msg: Msg, *, kind: DeadLetterKind, reason: str) -> None:
        meta = msg.metadata
        while True:
            try:
                await publish_dead_letter(
                    self._bus.js,
                    spec=self._spec,
                    subject=published_subject(msg.subject),
                    payload=msg.data,
                    headers=msg.headers,
                    sequence=meta.sequence.stream,
                    deliveries=meta.num_delivered,
                    kind=kind,
                    reason=reason,
                )
                break
            except nats.errors.Error as exc:
                # Going on without it would lose the message silently: wait for JetStream.
                log.warning(
                    "dead letter not stored yet",
                    extra={"reader": self._spec.durable, "error": repr(exc)},
                )
                if self._stop.is_set():
                    log.error(
                        "stopped before a dead letter was stored",
                        extra={"reader": self._spec.durable, "subject": msg.subject},
                    )
                    return
                await asyncio.sleep(_DEAD_LETTER_RETRY)
        self.dead_lettered += 1
        log.error(
            "message dead-lettered",
            extra={
                "consumer": self._spec.durable,
                "subject": msg.subject,
                "stream_sequence": meta.sequence.stream,
                "kind": kind,
                "reason": reason,
            },
        )


def nothing_to_read(info: api.ConsumerInfo) -> bool:
    """True when a new ordered consumer has nothing stored to deliver, so no message will
    come to say it caught up.

    ``num_pending`` 0 alone is not enough: the server may have pushed messages already (they
    wait in the client), and then the last one's own pending count says when all was read.
    Whether anything was pushed is the consumer sequence, not the stream one: on a stream
    whose messages were all purged or expired, a consumer starts past the last sequence the
    stream ever had, so ``delivered.stream_seq`` is that sequence though nothing was sent.
    Waiting for a message there waited forever (a restarted allocator never served).
    """
    delivered = info.delivered
    return info.num_pending == 0 and (delivered is None or not delivered.consumer_seq)


async def replay(
    bus: Bus, *, name: str, stream: str, subject: str, last_per_subject: bool = False
) -> list[AnyEvent]:
    """Every event of ``subject`` stored in ``stream`` now, in order.

    What it refuses goes to ``name``'s dead letter, as a :class:`Follower`'s does.

    >>> stored = await replay(bus, name="slice-publisher-inventory", stream=INVENTORY.name,
    ...                       subject="neuron.inventory.>")
    """
    events: list[AnyEvent] = []
    follower = Follower(
        bus,
        name=name,
        stream=stream,
        subject=subject,
        handler=events.append,
        last_per_subject=last_per_subject,
        once=True,
    )
    await follower.run()
    return events
