"""Publishing events to JetStream: de-duplicated, CloudEvents headers, traced, retried."""

from __future__ import annotations

import asyncio
import collections
import itertools
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
    new_msg_id,
)
from neuron_dra_common.bus.wire import (
    Wire,
    clean_value,
    encode_header_block,
    header_lines,
    hpub,
    parse_header_block,
)
from neuron_dra_common.events.base import Event
from neuron_dra_common.events.codec import encode
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


class _Prepared(msgspec.Struct, frozen=True, kw_only=True):
    subject: str
    payload: bytes
    header_block: bytes
    msg_id: str
    type: str


class _Window:
    """The PubAcks awaited for one run of pipelined publishes."""

    __slots__ = ("acks", "done", "missing")

    def __init__(self, size: int) -> None:
        self.acks: list[_PubAck | None] = [None] * size
        self.missing = size
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()


class Publisher:
    """Publishes events on their own subjects with the headers the consumers rely on.

    Every event is its own JetStream message with its own ``Nats-Msg-Id``. A publish that
    fails for a transient reason (timeout, NATS restarting, JetStream not ready) or is
    refused is sent again with the same id until ``retry_seconds`` pass, so it is stored
    exactly once even when the first attempt was stored but its ack was lost.

    :meth:`publish_many` pipelines: up to ``window`` publishes are written before their
    acks are awaited, and the acks come back on one subscription of the publisher.

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
        # The header lines every event of a type shares, encoded once.
        self._constant: dict[str, bytes] = {}
        self._reply_prefix = ""
        self._sub: Subscription | None = None
        self._tokens = itertools.count()
        self._waiting: dict[int, tuple[_Window, int]] = {}

    def _constant_lines(self, event_type: str) -> bytes:
        lines = self._constant.get(event_type)
        if lines is None:
            lines = self._constant[event_type] = header_lines(
                {
                    CE_SOURCE: self._source,
                    CE_TYPE: CE_TYPE_PREFIX + event_type,
                    CE_SPECVERSION: SPECVERSION,
                }
            )
        return lines

    def _prepare(self, event: Event, msg_id: str | None, trace_lines: bytes) -> _Prepared:
        mid = msg_id or new_msg_id()
        event_type = event.event_type()
        per_event = (
            f"{MSG_ID}: {clean_value(mid)}\r\n{CE_ID}: {clean_value(mid)}\r\n"
            f"{CE_TIME}: {ce_time()}\r\n{CE_SUBJECT}: {clean_value(event.ce_subject)}\r\n"
        )
        return _Prepared(
            subject=event.subject,
            payload=encode(event),
            header_block=encode_header_block(
                self._constant_lines(event_type), per_event.encode(), trace_lines
            ),
            msg_id=mid,
            type=event_type,
        )

    async def publish(self, event: Event, *, msg_id: str | None = None) -> PublishResult:
        """Publish one event and wait for JetStream to store it.

        Pass a ``msg_id`` derived from what the event is about (for example the claim uid and
        the step) to make a repeated publish by a restarted process a no-op.
        """
        with self._tracer.start_as_current_span(
            f"publish {event.event_type()}", kind=trace.SpanKind.PRODUCER
        ):
            prepared = self._prepare(event, msg_id, _trace_lines())
            return (await self._pipeline([prepared]))[0]

    async def publish_many(
        self, events: Sequence[Event], *, msg_ids: Sequence[str] | None = None
    ) -> list[PublishResult]:
        """Publish many events pipelined (acks awaited together), in order; same guarantees.

        Each event is published on its own with its own msg id; they share the trace context
        of one ``publish batch`` span. The server stores them in the given order; any that
        failed in flight are retried one by one with their ids, so none is lost and none
        stored twice.
        """
        if msg_ids is not None and len(msg_ids) != len(events):
            raise ValueError(f"publish_many: {len(msg_ids)} msg_ids for {len(events)} events")
        with self._tracer.start_as_current_span(
            "publish batch", kind=trace.SpanKind.PRODUCER, attributes={"events": len(events)}
        ):
            trace_lines = _trace_lines()
            prepared = [
                self._prepare(event, msg_ids[i] if msg_ids else None, trace_lines)
                for i, event in enumerate(events)
            ]
        return await self._pipeline(prepared)

    async def _pipeline(self, prepared: list[_Prepared]) -> list[PublishResult]:
        # Windows are written back to back; the acks of one are awaited while the next is
        # on the wire, so the server never waits for the publisher.
        results: list[PublishResult] = []
        in_flight: collections.deque[tuple[list[_Prepared], _Window | None]] = collections.deque()
        size = self._window
        for lo in range(0, len(prepared), size):
            items = prepared[lo : lo + size]
            in_flight.append((items, await self._write(items)))
            if len(in_flight) > 1:
                results += await self._settle(*in_flight.popleft())
        while in_flight:
            results += await self._settle(*in_flight.popleft())
        return results

    async def _write(self, items: list[_Prepared]) -> _Window | None:
        """Write ``items`` with one reply subject each; ``None`` if nothing could be written."""
        if self._sub is None:
            self._reply_prefix = self._nc.new_inbox() + "."
            self._sub = await self._wire.subscribe(self._reply_prefix + "*", self._on_ack)
        window = _Window(len(items))
        prefix = self._reply_prefix
        commands = []
        for index, item in enumerate(items):
            token = next(self._tokens)
            self._waiting[token] = (window, index)
            commands.append(hpub(item.subject, f"{prefix}{token}", item.header_block, item.payload))
        try:
            await self._wire.send(b"".join(commands))
        except TRANSIENT:
            self._forget(window)
            return None
        except BaseException:
            self._forget(window)
            raise
        return window

    def _on_ack(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        try:
            token = int(subject[len(self._reply_prefix) :])
        except ValueError:
            return
        entry = self._waiting.pop(token, None)
        if entry is None:
            return  # a late ack of a publish already retried
        window, index = entry
        if data:  # an empty reply is a status: no stream responded
            try:
                window.acks[index] = _PUBACK.decode(data)
            except msgspec.DecodeError:
                log.warning("unreadable PubAck", extra={"data": data[:200]})
        window.missing -= 1
        if window.missing == 0 and not window.done.done():
            window.done.set_result(None)

    def _forget(self, window: _Window) -> None:
        for token in [t for t, (w, _) in self._waiting.items() if w is window]:
            del self._waiting[token]

    async def _settle(self, items: list[_Prepared], window: _Window | None) -> list[PublishResult]:
        if window is not None and window.missing:
            # One deadline for the whole window: after a lost connection many acks never
            # come, and waiting for each in turn would add their timeouts up.
            await asyncio.wait([window.done], timeout=self._ack_timeout)
            if window.missing:
                self._forget(window)
        results: list[PublishResult] = []
        stored: collections.Counter[str] = collections.Counter()
        for index, item in enumerate(items):
            ack = window.acks[index] if window is not None else None
            if ack is not None and ack.error is None and ack.stream:
                stored[item.type] += 1
                results.append(
                    PublishResult(
                        msg_id=item.msg_id,
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
        headers = parse_header_block(item.header_block)
        deadline = time.monotonic() + self._retry_seconds
        attempt = 0
        while True:
            try:
                ack = await self._js.publish(
                    item.subject, item.payload, timeout=self._ack_timeout, headers=headers
                )
                metrics.PUBLISHED.labels(item.type).inc()
                return PublishResult(
                    msg_id=item.msg_id,
                    stream=ack.stream,
                    sequence=ack.seq,
                    duplicate=bool(ack.duplicate),
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

    async def close(self) -> None:
        """Stop listening for acks (the connection's drain does this too)."""
        if self._sub is not None:
            sub, self._sub = self._sub, None
            await self._wire.unsubscribe(sub)


def _trace_lines() -> bytes:
    """``traceparent``/``tracestate`` lines of the current span, or nothing without one."""
    carrier: dict[str, str] = {}
    inject_headers(carrier)
    return header_lines(carrier) if carrier else b""
