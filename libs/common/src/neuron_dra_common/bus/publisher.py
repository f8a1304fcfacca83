"""Publishing events to JetStream: de-duplicated, CloudEvents headers, traced, retried."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any, Final

import msgspec
import nats.errors
from nats.js import JetStreamContext, api
from opentelemetry import trace

from neuron_dra_common.bus import metrics
from neuron_dra_common.bus.errors import TRANSIENT, PublishError
from neuron_dra_common.bus.headers import (
    CE_ID,
    CE_SOURCE,
    CE_SPECVERSION,
    CE_SUBJECT,
    CE_TIME,
    CE_TYPE,
    CE_TYPE_PREFIX,
    MSG_ID,
    SPECVERSION,
    ce_time,
    new_msg_ids,
)
from neuron_dra_common.events.base import Event
from neuron_dra_common.events.codec import encode
from neuron_dra_common.telemetry.propagation import inject_headers
from neuron_dra_common.telemetry.tracing import get_tracer, tracing_enabled

__all__ = ["PublishResult", "Publisher"]

log = logging.getLogger(__name__)

_RETRY_PAUSE: Final = (0.05, 0.1, 0.25, 0.5, 1.0)
#: Events handed to the client at a time within a window; the acks of one slice are
#: awaited together.
_SLICE: Final = 500
#: How many asynchronous publishes nats-py keeps unacknowledged at most (its
#: ``publish_async_max_pending`` default, which the bus keeps): the largest window.
_CLIENT_PENDING: Final = 4000


class PublishResult(msgspec.Struct, frozen=True, kw_only=True):
    """Where JetStream stored an event; ``duplicate`` when the msg id was already stored."""

    msg_id: str
    stream: str
    sequence: int
    duplicate: bool = False


class _Item(msgspec.Struct, kw_only=True):
    """One event on its way: what goes out, and the client's future for its PubAck."""

    subject: str
    payload: bytes
    headers: dict[str, str]
    msg_id: str
    event_type: str
    ack: asyncio.Future[api.PubAck] | None = None


class Publisher:
    """Publishes events on their own subjects with the headers the consumers rely on.

    Every event is its own JetStream message with its own ``Nats-Msg-Id``. A publish that
    fails for a transient reason (timeout, NATS restarting, JetStream not ready) is sent
    again with the same id until ``retry_seconds`` pass, so it is stored exactly once even
    when the first attempt was stored but its ack was lost.

    :meth:`publish_many` hands events to the client's asynchronous publish
    (``JetStreamContext.publish_async``) and keeps up to ``window`` of them unacknowledged
    (at most the client's own bound, ``publish_async_max_pending``).

    >>> pub = Publisher(js, source="/neuron-dra/discovery/ip-1")
    >>> await pub.publish(NodeHeartbeat(node="ip-1", boot_id="b", sequence=1, sent_at=now))
    """

    def __init__(
        self,
        js: JetStreamContext,
        *,
        source: str,
        ack_timeout: float = 5.0,
        retry_seconds: float = 60.0,
        window: int = 2000,
        tracer: trace.Tracer | None = None,
    ) -> None:
        self._js = js
        self._source = source
        self._ack_timeout = ack_timeout
        self._retry_seconds = retry_seconds
        self._window = max(1, min(window, _CLIENT_PENDING))
        # A tracer handed in always records; the process's only once tracing is on (an
        # unrecorded span per batch costs more than a batch's bookkeeping).
        self._always = tracer is not None
        self._tracer = tracer or get_tracer()
        # Per event class: its type and the headers every event of it shares.
        self._kinds: dict[type[Event], tuple[str, dict[str, str]]] = {}

    def _kind(self, cls: type[Event]) -> tuple[str, dict[str, str]]:
        kind = self._kinds.get(cls)
        if kind is None:
            event_type = cls.event_type()
            constant = {
                CE_SOURCE: self._source,
                CE_TYPE: CE_TYPE_PREFIX + event_type,
                CE_SPECVERSION: SPECVERSION,
            }
            kind = self._kinds[cls] = (event_type, constant)
        return kind

    def _items(
        self, events: Sequence[Event], msg_ids: Sequence[str], context: dict[str, str]
    ) -> list[_Item]:
        """Subject, payload and headers of each event; they share ``ce-time`` and trace."""
        now = ce_time()
        items: list[_Item] = []
        for event, msg_id in zip(events, msg_ids, strict=True):
            event_type, constant = self._kind(type(event))
            headers = {
                MSG_ID: msg_id,
                CE_ID: msg_id,
                **constant,
                CE_TIME: now,
                CE_SUBJECT: event.ce_subject,
                **context,
            }
            items.append(
                _Item(
                    subject=event.subject,
                    payload=encode(event),
                    headers=headers,
                    msg_id=msg_id,
                    event_type=event_type,
                )
            )
        return items

    def _span(self, name: str, **attributes: Any) -> contextlib.AbstractContextManager[Any]:
        """A producer span, or (tracing off) none: the events then carry the caller's trace
        context, if any, as they would a span nobody records."""
        if not self._always and not tracing_enabled():
            return contextlib.nullcontext()
        return self._tracer.start_as_current_span(
            name, kind=trace.SpanKind.PRODUCER, attributes=attributes or None
        )

    async def publish(self, event: Event, *, msg_id: str | None = None) -> PublishResult:
        """Publish one event and wait for JetStream to store it.

        Pass a ``msg_id`` derived from what the event is about (for example the claim uid and
        the step) to make a repeated publish by a restarted process a no-op.
        """
        with self._span(f"publish {event.event_type()}"):
            ids = (msg_id,) if msg_id else new_msg_ids(1)
            [item] = self._items((event,), ids, _trace_context())
        return await self._send(item)

    async def publish_many(
        self, events: Sequence[Event], *, msg_ids: Sequence[str] | None = None
    ) -> list[PublishResult]:
        """Publish many events with their acks awaited together, in order; same guarantees.

        Each event is published on its own with its own msg id; they share the trace context
        of one ``publish batch`` span and one ``ce-time``. The server stores them in the
        given order; any that failed in flight are retried one by one with their ids, so
        none is lost and none stored twice.
        """
        if msg_ids is not None and len(msg_ids) != len(events):
            raise ValueError(f"publish_many: {len(msg_ids)} msg_ids for {len(events)} events")
        with self._span("publish batch", events=len(events)):
            context = _trace_context()
        ids = msg_ids if msg_ids is not None else new_msg_ids(len(events))
        step = min(self._window, _SLICE)
        results: list[PublishResult] = []
        in_flight: collections.deque[list[_Item]] = collections.deque()
        outstanding = 0
        for lo in range(0, len(events), step):
            items = self._items(events[lo : lo + step], ids[lo : lo + step], context)
            await self._start(items)
            await asyncio.sleep(0)  # the client's flusher writes this slice meanwhile
            in_flight.append(items)
            outstanding += len(items)
            while outstanding > self._window:
                done = in_flight.popleft()
                outstanding -= len(done)
                results += await self._settle(done)
        while in_flight:
            results += await self._settle(in_flight.popleft())
        return results

    async def _start(self, items: list[_Item]) -> None:
        """Hand ``items`` to the client; one that could not be sent is left without a future."""
        js = self._js
        for item in items:
            # Below the window the client has room (its own bound is at least the window),
            # and not asking for a stall deadline lets the whole slice go out in one write
            # instead of one per event.
            stall = None if js.publish_async_pending() < self._window else self._ack_timeout
            try:
                item.ack = await js.publish_async(
                    item.subject, item.payload, headers=item.headers, wait_stall=stall
                )
            except TRANSIENT:
                item.ack = None  # settled by a publish of its own

    async def _settle(self, items: list[_Item]) -> list[PublishResult]:
        """Wait for the acks of ``items``; any missing or failed is published again alone."""
        futures = [item.ack for item in items if item.ack is not None and not item.ack.done()]
        if futures:
            # One deadline for the slice: after a lost connection many acks never come, and
            # waiting for each in turn would add their timeouts up.
            await asyncio.wait(futures, timeout=self._ack_timeout)
        results: list[PublishResult] = []
        stored: collections.Counter[str] = collections.Counter()
        for item in items:
            ack = item.ack
            if ack is not None and ack.done() and not ack.cancelled() and not ack.exception():
                pub_ack = ack.result()
                stored[item.event_type] += 1
                results.append(
                    PublishResult(
                        msg_id=item.msg_id,
                        stream=pub_ack.stream,
                        sequence=pub_ack.seq,
                        duplicate=bool(pub_ack.duplicate),
                    )
                )
                continue
            if ack is not None and not ack.done():
                ack.cancel()  # frees its place in the client's window
            results.append(await self._send(item))
        for event_type, count in stored.items():
            metrics.PUBLISHED.labels(event_type).inc(count)
        return results

    async def _send(self, item: _Item) -> PublishResult:
        """Publish one event and wait for its ack until stored; other errors are raised."""
        deadline = time.monotonic() + self._retry_seconds
        attempt = 0
        while True:
            try:
                ack = await self._js.publish(
                    item.subject, item.payload, timeout=self._ack_timeout, headers=item.headers
                )
            except TRANSIENT as exc:
                if time.monotonic() >= deadline:
                    raise PublishError(
                        f"publish {item.subject} (msg id {item.msg_id}): no ack from JetStream "
                        f"within {self._retry_seconds}s: {exc!r}"
                    ) from exc
                metrics.PUBLISH_RETRIES.inc()
                pause = _RETRY_PAUSE[min(attempt, len(_RETRY_PAUSE) - 1)]
                attempt += 1
                log.debug(
                    "publish retry",
                    extra={"subject": item.subject, "msg_id": item.msg_id, "error": repr(exc)},
                )
                await asyncio.sleep(pause)
            except nats.errors.ConnectionClosedError as exc:
                raise PublishError(
                    f"publish {item.subject} (msg id {item.msg_id}): the connection is closed"
                ) from exc
            else:
                metrics.PUBLISHED.labels(item.event_type).inc()
                return PublishResult(
                    msg_id=item.msg_id,
                    stream=ack.stream,
                    sequence=ack.seq,
                    duplicate=bool(ack.duplicate),
                )


def _trace_context() -> dict[str, str]:
    """``traceparent``/``tracestate`` of the current span, or nothing without one."""
    carrier: dict[str, str] = {}
    inject_headers(carrier)
    return carrier
