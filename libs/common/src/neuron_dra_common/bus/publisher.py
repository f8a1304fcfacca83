"""Publishing events to JetStream: de-duplicated, CloudEvents headers, traced, retried."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Final

import msgspec
from nats.js import JetStreamContext, api
from opentelemetry import trace

from neuron_dra_common.bus import metrics
from neuron_dra_common.bus.errors import TRANSIENT, PublishError
from neuron_dra_common.bus.headers import event_headers, new_msg_id
from neuron_dra_common.events.base import Event
from neuron_dra_common.events.codec import encode
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


class _Prepared(msgspec.Struct, frozen=True, kw_only=True):
    subject: str
    payload: bytes
    headers: dict[str, str]
    msg_id: str
    type: str


class Publisher:
    """Publishes events on their own subjects with the headers the consumers rely on.

    A publish that fails for a transient reason (timeout, NATS restarting, JetStream not
    ready) is sent again with the same ``Nats-Msg-Id`` until ``retry_seconds`` pass, so it is
    stored exactly once even when the first attempt was stored but its ack was lost.

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
        tracer: trace.Tracer | None = None,
    ) -> None:
        self._js = js
        self._source = source
        self._ack_timeout = ack_timeout
        self._retry_seconds = retry_seconds
        self._tracer = tracer or get_tracer()

    def _prepare(self, event: Event, msg_id: str | None) -> _Prepared:
        mid = msg_id or new_msg_id()
        return _Prepared(
            subject=event.subject,
            payload=encode(event),
            headers=event_headers(event, source=self._source, msg_id=mid),
            msg_id=mid,
            type=event.event_type(),
        )

    async def publish(self, event: Event, *, msg_id: str | None = None) -> PublishResult:
        """Publish one event and wait for JetStream to store it.

        Pass a ``msg_id`` derived from what the event is about (for example the claim uid and
        the step) to make a repeated publish by a restarted process a no-op.
        """
        with self._tracer.start_as_current_span(
            f"publish {event.event_type()}", kind=trace.SpanKind.PRODUCER
        ):
            prepared = self._prepare(event, msg_id)
            return await self._send(prepared)

    async def publish_many(
        self, events: Sequence[Event], *, msg_ids: Sequence[str] | None = None
    ) -> list[PublishResult]:
        """Publish many events pipelined (acks awaited together), in order; same guarantees.

        The server stores them in the given order; any that failed in flight are retried one
        by one with their ids, so none is lost and none stored twice.
        """
        if msg_ids is not None and len(msg_ids) != len(events):
            raise ValueError(f"publish_many: {len(msg_ids)} msg_ids for {len(events)} events")
        with self._tracer.start_as_current_span(
            "publish batch", kind=trace.SpanKind.PRODUCER, attributes={"events": len(events)}
        ):
            prepared = [
                self._prepare(event, msg_ids[i] if msg_ids else None)
                for i, event in enumerate(events)
            ]
        futures: list[asyncio.Future[api.PubAck] | None] = []
        for item in prepared:
            try:
                future = await self._js.publish_async(
                    item.subject, item.payload, wait_stall=self._ack_timeout, headers=item.headers
                )
            except TRANSIENT:
                future = None
            futures.append(future)
        # One deadline for the whole window: after a lost connection many acks never come,
        # and waiting for each in turn would add their timeouts up.
        in_flight = [f for f in futures if f is not None]
        if in_flight:
            await asyncio.wait(in_flight, timeout=self._ack_timeout)
        results: list[PublishResult] = []
        for item, future in zip(prepared, futures, strict=True):
            ack = _ack_of(future)
            results.append(self._result(item, ack) if ack else await self._send(item))
        return results

    def _result(self, item: _Prepared, ack: api.PubAck) -> PublishResult:
        metrics.PUBLISHED.labels(item.type).inc()
        return PublishResult(
            msg_id=item.msg_id,
            stream=ack.stream,
            sequence=ack.seq,
            duplicate=bool(ack.duplicate),
        )

    async def _send(self, item: _Prepared) -> PublishResult:
        deadline = time.monotonic() + self._retry_seconds
        attempt = 0
        while True:
            try:
                ack = await self._js.publish(
                    item.subject, item.payload, timeout=self._ack_timeout, headers=item.headers
                )
                return self._result(item, ack)
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


def _ack_of(future: asyncio.Future[api.PubAck] | None) -> api.PubAck | None:
    """The ack of a finished publish, or None if it failed, timed out or never started."""
    if future is None:
        return None
    if not future.done():
        future.cancel()
        return None
    if future.cancelled() or future.exception() is not None:
        return None
    return future.result()
