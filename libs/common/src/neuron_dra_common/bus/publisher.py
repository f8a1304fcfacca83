"""Publishing events to JetStream: de-duplicated, CloudEvents headers, traced, retried."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Sequence
from typing import Final

import msgspec
from nats.aio.client import Client
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
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
from neuron_dra_common.bus.wire import RawMsg, Wire, clean_value, header_lines, parse_header_block
from neuron_dra_common.events.base import Event
from neuron_dra_common.events.codec import encode as _encode
from neuron_dra_common.telemetry.propagation import inject_headers
from neuron_dra_common.telemetry.tracing import get_tracer

__all__ = ["PublishResult", "Publisher"]

log = logging.getLogger(__name__)

_RETRY_PAUSE: Final = (0.05, 0.1, 0.25, 0.5, 1.0)


class PublishResult(msgspec.Struct, frozen=True, kw_only=True):
    """Where JetStream stored an event; ``duplicate`` when the msg id was already stored."""

    msg_id: str
    stream: str
    sequence: int
    duplicate: bool = False


class _ApiError(msgspec.Struct, frozen=True):
    code: int = 0
    err_code: int = 0
    description: str = ""


class _PubAck(msgspec.Struct, frozen=True):
    stream: str = ""
    seq: int = 0
    duplicate: bool = False
    error: _ApiError | None = None


_PUBACK: Final = msgspec.json.Decoder(_PubAck)
_CRLF: Final = b"\r\n"
#: Events encoded and written at a time within a window.
_SLICE: Final = 256


#: One event ready to go: subject (bytes), payload, header block, msg id, event type.
_Prepared = tuple[bytes, bytes, bytes, str, str]


class _Window:
    """The PubAcks awaited for one run of pipelined publishes (reply tokens from ``base``)."""

    __slots__ = ("acks", "base", "done", "missing")

    def __init__(self, size: int, base: int) -> None:
        self.acks: list[_PubAck | None] = [None] * size
        self.base = base
        self.missing = size
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()


class Publisher:
    """Publishes events on their own subjects with the headers the consumers rely on.

    Every event is its own JetStream message with its own ``Nats-Msg-Id``. A publish that
    fails for a transient reason (timeout, NATS restarting, JetStream not ready) or is
    refused is sent again with the same id until ``retry_seconds`` pass, so it is stored
    exactly once even when the first attempt was stored but its ack was lost.

    :meth:`publish_many` pipelines: events are encoded and written a slice at a time (the
    server stores one slice while the next is encoded), up to ``window`` publishes are
    written before their acks are awaited, and the acks come back on one subscription of
    the publisher.

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
        nc: Client | None = None,
    ) -> None:
        self._js = js
        self._nc: Client = nc if nc is not None else js._nc
        self._wire = Wire.of(self._nc)
        self._source = source
        self._ack_timeout = ack_timeout
        self._retry_seconds = retry_seconds
        self._window = max(1, window)
        self._tracer = tracer or get_tracer()
        # Per event class: its type and the header lines every event of it shares.
        self._kinds: dict[type[Event], tuple[str, str]] = {}
        self._reply_prefix = b""
        self._sub: Subscription | None = None
        self._next_token = 0
        self._waiting: dict[int, _Window] = {}

    def _kind(self, cls: type[Event]) -> tuple[str, str]:
        kind = self._kinds.get(cls)
        if kind is None:
            event_type = cls.event_type()
            lines = header_lines(
                {
                    CE_SOURCE: self._source,
                    CE_TYPE: CE_TYPE_PREFIX + event_type,
                    CE_SPECVERSION: SPECVERSION,
                }
            )
            kind = self._kinds[cls] = (event_type, lines.decode())
        return kind

    def _prepare(
        self, events: Sequence[Event], msg_ids: Sequence[str], trace_lines: str, now: str
    ) -> list[_Prepared]:
        """Subject, payload and header block of each event."""
        kinds = self._kinds
        prepared: list[_Prepared] = []
        for event, mid in zip(events, msg_ids, strict=True):
            cls = type(event)
            event_type, constant = kinds.get(cls) or self._kind(cls)
            about = event.ce_subject
            if "\r" in mid or "\n" in mid or "\r" in about or "\n" in about:
                about = clean_value(about)
                line_id = clean_value(mid)
            else:
                line_id = mid
            block = (
                f"NATS/1.0\r\n{constant}{MSG_ID}: {line_id}\r\n{CE_ID}: {line_id}\r\n"
                f"{CE_TIME}: {now}\r\n{CE_SUBJECT}: {about}\r\n{trace_lines}\r\n"
            ).encode()
            prepared.append((event.subject.encode(), _encode(event), block, mid, event_type))
        return prepared

    async def publish(self, event: Event, *, msg_id: str | None = None) -> PublishResult:
        """Publish one event and wait for JetStream to store it.

        Pass a ``msg_id`` derived from what the event is about (for example the claim uid and
        the step) to make a repeated publish by a restarted process a no-op.
        """
        with self._tracer.start_as_current_span(
            f"publish {event.event_type()}", kind=trace.SpanKind.PRODUCER
        ):
            ids = (msg_id,) if msg_id else None
            return (await self._pipeline((event,), ids, _trace_lines()))[0]

    async def publish_many(
        self, events: Sequence[Event], *, msg_ids: Sequence[str] | None = None
    ) -> list[PublishResult]:
        """Publish many events pipelined (acks awaited together), in order; same guarantees.

        Each event is published on its own with its own msg id; they share the trace context
        of one ``publish batch`` span and one ``ce-time``. The server stores them in the
        given order; any that failed in flight are retried one by one with their ids, so
        none is lost and none stored twice.
        """
        if msg_ids is not None and len(msg_ids) != len(events):
            raise ValueError(f"publish_many: {len(msg_ids)} msg_ids for {len(events)} events")
        with self._tracer.start_as_current_span(
            "publish batch", kind=trace.SpanKind.PRODUCER, attributes={"events": len(events)}
        ):
            trace_lines = _trace_lines()
        return await self._pipeline(events, msg_ids, trace_lines)

    async def _pipeline(
        self, events: Sequence[Event], msg_ids: Sequence[str] | None, trace_lines: str
    ) -> list[PublishResult]:
        # Events are encoded and written a slice at a time, each slice going out while the
        # next is encoded, so the server starts storing before the last is ready. Up to
        # ``window`` publishes stay unacknowledged; past that the oldest slice is settled.
        ids = msg_ids if msg_ids is not None else new_msg_ids(len(events))
        now = ce_time()
        step = min(self._window, _SLICE)
        results: list[PublishResult] = []
        in_flight: collections.deque[tuple[list[_Prepared], _Window | None]] = collections.deque()
        outstanding = 0
        for lo in range(0, len(events), step):
            items = self._prepare(events[lo : lo + step], ids[lo : lo + step], trace_lines, now)
            in_flight.append((items, await self._write(items)))
            outstanding += len(items)
            while outstanding > self._window:
                done, window = in_flight.popleft()
                outstanding -= len(done)
                results += await self._settle(done, window)
            if lo + step < len(events):
                await asyncio.sleep(0)  # the flusher writes this slice now
        while in_flight:
            results += await self._settle(*in_flight.popleft())
        return results

    async def _write(self, items: list[_Prepared]) -> _Window | None:
        """Write ``items`` with one reply subject each; ``None`` if nothing could be written."""
        if self._sub is None:
            inbox = self._nc.new_inbox()
            self._sub = await self._wire.subscribe(f"{inbox}.*", self._on_ack)
            self._reply_prefix = f"{inbox}.".encode()
        base = self._next_token
        self._next_token = base + len(items)
        window = _Window(len(items), base)
        waiting = self._waiting
        reply_prefix = self._reply_prefix
        parts: list[bytes] = []
        append = parts.append
        token = base
        for subject, payload, block, _, _ in items:
            waiting[token] = window
            size = len(block)
            append(
                b"HPUB %b %b%d %d %d\r\n"
                % (subject, reply_prefix, token, size, size + len(payload))
            )
            append(block)
            append(payload)
            append(_CRLF)
            token += 1
        try:
            await self._wire.send(b"".join(parts))
        except TRANSIENT:
            self._forget(window)
            return None
        except BaseException:
            self._forget(window)
            raise
        return window

    def _on_ack(self, msg: RawMsg) -> None:
        subject, _, data, _ = msg
        try:
            token = int(subject[len(self._reply_prefix) :])
        except ValueError:
            return
        window = self._waiting.pop(token, None)
        if window is None:
            return  # a late ack of a publish already retried
        if data:  # an empty reply is a status: no stream responded
            try:
                window.acks[token - window.base] = _PUBACK.decode(data)
            except msgspec.DecodeError:
                log.warning("unreadable PubAck", extra={"data": data[:200]})
        window.missing -= 1
        if window.missing == 0 and not window.done.done():
            window.done.set_result(None)

    def _forget(self, window: _Window) -> None:
        pop = self._waiting.pop
        for token in range(window.base, window.base + len(window.acks)):
            pop(token, None)

    async def _settle(self, items: list[_Prepared], window: _Window | None) -> list[PublishResult]:
        if window is not None and window.missing:
            # One deadline for the whole window: after a lost connection many acks never
            # come, and waiting for each in turn would add their timeouts up.
            await asyncio.wait([window.done], timeout=self._ack_timeout)
            if window.missing:
                self._forget(window)
        acks = window.acks if window is not None else [None] * len(items)
        results: list[PublishResult] = []
        stored: dict[str, int] = {}
        for item, ack in zip(items, acks, strict=True):
            if ack is not None and ack.error is None and ack.stream:
                event_type = item[4]
                stored[event_type] = stored.get(event_type, 0) + 1
                results.append(
                    PublishResult(
                        msg_id=item[3],
                        stream=ack.stream,
                        sequence=ack.seq,
                        duplicate=ack.duplicate,
                    )
                )
            else:
                results.append(await self._send(item))
        for event_type, count in stored.items():
            metrics.PUBLISHED.labels(event_type).inc(count)
        return results

    async def _send(self, item: _Prepared) -> PublishResult:
        """Publish one event as a request until stored; errors that cannot pass are raised."""
        raw_subject, payload, block, msg_id, event_type = item
        subject = raw_subject.decode()
        headers = parse_header_block(block)
        deadline = time.monotonic() + self._retry_seconds
        attempt = 0
        while True:
            try:
                ack = await self._js.publish(
                    subject, payload, timeout=self._ack_timeout, headers=headers
                )
                metrics.PUBLISHED.labels(event_type).inc()
                return PublishResult(
                    msg_id=msg_id,
                    stream=ack.stream,
                    sequence=ack.seq,
                    duplicate=bool(ack.duplicate),
                )
            except TRANSIENT as exc:
                if time.monotonic() >= deadline:
                    raise PublishError(
                        f"publish {subject} (msg id {msg_id}): no ack from JetStream "
                        f"within {self._retry_seconds}s: {exc!r}"
                    ) from exc
                metrics.PUBLISH_RETRIES.inc()
                pause = _RETRY_PAUSE[min(attempt, len(_RETRY_PAUSE) - 1)]
                attempt += 1
                log.debug(
                    "publish retry",
                    extra={"subject": subject, "msg_id": msg_id, "error": repr(exc)},
                )
                await asyncio.sleep(pause)

    async def close(self) -> None:
        """Stop listening for acks (the connection's drain does this too)."""
        if self._sub is not None:
            sub, self._sub = self._sub, None
            await self._wire.unsubscribe(sub)


def _trace_lines() -> str:
    """``traceparent``/``tracestate`` lines of the current span, or nothing without one."""
    carrier: dict[str, str] = {}
    inject_headers(carrier)
    return header_lines(carrier).decode() if carrier else ""
