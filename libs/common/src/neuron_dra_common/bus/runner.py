"""A durable pull-consumer runner: decode, handle, ack; retry with backoff; dead-letter.

What a handler can count on:
- it sees each stored message until it returns without raising; a failure is retried after
  ``backoff`` and, once ``max_attempts`` deliveries failed, the message goes to the dead
  letter with the reason (so does a payload that does not decode, at once);
- a message it already handled in this process is acked again without calling it (a lost
  ack after a NATS restart); across processes it gets :class:`Delivery` (stream sequence,
  msg id, delivery count) to make its own effects idempotent;
- it runs inside a span that continues the publisher's trace, and a slow handler keeps the
  message from being redelivered by in-progress acks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Final

import msgspec
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from opentelemetry import trace

from neuron_dra_common.bus import metrics
from neuron_dra_common.bus.deadletter import DeadLetterKind, publish_dead_letter
from neuron_dra_common.bus.declarations import ConsumerSpec
from neuron_dra_common.bus.errors import PermanentError
from neuron_dra_common.bus.headers import MSG_ID, CloudEventAttributes, cloud_event_attributes
from neuron_dra_common.bus.reconcile import reconcile_consumer
from neuron_dra_common.events.codec import AnyEvent, DecodeError, decode
from neuron_dra_common.telemetry.propagation import extract_headers
from neuron_dra_common.telemetry.tracing import get_tracer

__all__ = ["ConsumerRunner", "Delivery", "Handler", "RunnerOptions"]

log = logging.getLogger(__name__)

_PAUSE_AFTER_ERROR: Final = 0.5


class Delivery(msgspec.Struct, frozen=True, kw_only=True):
    """Where a message came from and how often it was delivered, for idempotent handlers.

    ``stream_sequence`` is unique and increasing per stream; ``msg_id`` is the publisher's
    de-duplication id (stable across a publisher's retries).
    """

    subject: str
    stream: str
    consumer: str
    stream_sequence: int
    consumer_sequence: int
    deliveries: int
    msg_id: str
    headers: dict[str, str]
    cloud_event: CloudEventAttributes | None = None

    @property
    def redelivered(self) -> bool:
        return self.deliveries > 1


Handler = Callable[[AnyEvent, Delivery], Awaitable[None]]


def _owed_after_status(owed: int, status: str, headers: dict[str, str]) -> int:
    """How many messages are still owed after a status message from the server.

    408 (request expired) and 409 (e.g. leadership change) say how many of a request were
    not delivered; without that count the request is gone, so nothing is relied on as owed.
    100 (heartbeat) changes nothing.
    """
    if status.startswith("100"):
        return owed
    pending = headers.get("Nats-Pending-Messages")
    if pending is not None and pending.isdigit():
        return max(0, owed - int(pending))
    return 0


class RunnerOptions(msgspec.Struct, frozen=True, kw_only=True):
    """How a runner fetches, retries and times out.

    ``backoff[i]`` is the pause before delivery ``i + 2``; the last value repeats.
    ``progress_interval`` defaults to a third of the consumer's ack wait.
    ``dedupe_window`` is how many handled msg ids the runner remembers.
    """

    batch: int = 500
    fetch_timeout: float = 1.0
    handler_timeout: float = 30.0
    max_attempts: int = 5
    backoff: tuple[float, ...] = (0.5, 1.0, 2.0, 5.0, 10.0)
    progress_interval: float | None = None
    dedupe_window: int = 100_000


class ConsumerRunner:
    """Runs ``handler`` for every message of one durable consumer until :meth:`stop`.

    >>> runner = ConsumerRunner(nc, consumer("slice-publisher-inventory"), handle)
    >>> await runner.run()  # in a named task; runner.stop() drains it
    """

    def __init__(
        self,
        nc: Client,
        spec: ConsumerSpec,
        handler: Handler,
        *,
        options: RunnerOptions | None = None,
        tracer: trace.Tracer | None = None,
    ) -> None:
        self.spec = spec
        self._nc = nc
        self._js: JetStreamContext = nc.jetstream()
        self._handler = handler
        self._options = options or RunnerOptions()
        self._stopping = asyncio.Event()
        self._ready = False
        self._done: OrderedDict[str, None] = OrderedDict()
        self._tracer = tracer or get_tracer()
        self._current: Msg | None = None
        self._current_since = 0.0
        name = spec.durable
        self._m_acked = metrics.MESSAGES.labels(name, "acked")
        self._m_retried = metrics.MESSAGES.labels(name, "retried")
        self._m_duplicate = metrics.MESSAGES.labels(name, "duplicate")
        self._m_dead = metrics.MESSAGES.labels(name, "dead_lettered")
        self._m_requeued = metrics.MESSAGES.labels(name, "requeued")
        self._m_seconds = metrics.HANDLE_SECONDS.labels(name)

    @property
    def ready(self) -> bool:
        """True once the consumer exists and the runner is fetching."""
        return self._ready

    def stop(self) -> None:
        """Finish the message in hand, hand back the rest of the batch, then return from run."""
        self._stopping.set()

    async def run(self) -> None:
        """Reconcile the consumer, then pull and handle until stopped.

        Pull requests are kept outstanding ahead of the handler (a new one whenever fewer
        than half a batch is still owed), so messages stream in without a round trip per
        batch. Requests lost with a connection are noticed by the reconnect count.
        """
        await reconcile_consumer(self._js, self.spec)
        nc, opts = self._nc, self._options
        queue: asyncio.Queue[Msg] = asyncio.Queue()

        async def deliver(msg: Msg) -> None:
            queue.put_nowait(msg)

        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox, cb=deliver, pending_msgs_limit=-1, pending_bytes_limit=-1)
        next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{self.spec.stream}.{self.spec.durable}"
        expires = max(1.0, opts.fetch_timeout * 5)
        request = msgspec.json.encode({"batch": opts.batch, "expires": int(expires * 1e9)})
        progress = asyncio.create_task(
            self._progress_loop(), name=f"bus-progress-{self.spec.durable}"
        )
        owed = 0
        reconnects = nc.stats["reconnects"]
        last_seen = time.monotonic()
        self._ready = True
        try:
            while not self._stopping.is_set():
                if nc.stats["reconnects"] != reconnects:
                    reconnects, owed = nc.stats["reconnects"], 0
                if owed <= opts.batch // 2 and nc.is_connected:
                    try:
                        await nc.publish(next_subject, request, reply=inbox)
                        owed += opts.batch
                    except nats.errors.Error as exc:
                        log.warning("pull request failed", extra={"error": repr(exc)})
                        await asyncio.sleep(_PAUSE_AFTER_ERROR)
                        continue
                try:
                    msg = queue.get_nowait()
                except asyncio.QueueEmpty:
                    try:
                        msg = await asyncio.wait_for(queue.get(), opts.fetch_timeout)
                    except TimeoutError:
                        if time.monotonic() - last_seen > expires + 1:
                            owed = 0  # requests expired without a word (server restarted)
                        continue
                last_seen = time.monotonic()
                status = msg.headers.get("Status") if msg.headers else None
                if status is not None:
                    owed = _owed_after_status(owed, status, msg.headers or {})
                    continue
                owed -= 1
                await self._process(msg)
        finally:
            self._ready = False
            progress.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await progress
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
            left = []
            while not queue.empty():
                msg = queue.get_nowait()
                if not (msg.headers and "Status" in msg.headers):
                    left.append(msg)
            await self._requeue(left)

    async def _requeue(self, msgs: list[Msg]) -> None:
        # Handing back at once lets another instance take them without waiting for ack_wait.
        for msg in msgs:
            with contextlib.suppress(nats.errors.Error):
                await msg.nak()
            self._m_requeued.inc()

    async def _progress_loop(self) -> None:
        interval = self._options.progress_interval or self.spec.ack_wait_seconds / 3
        while True:
            await asyncio.sleep(interval)
            msg = self._current
            if msg is not None and time.monotonic() - self._current_since >= interval:
                with contextlib.suppress(nats.errors.Error):
                    await msg.in_progress()

    def _delivery(self, msg: Msg) -> Delivery:
        meta = msg.metadata
        headers = msg.headers or {}
        return Delivery(
            subject=msg.subject,
            stream=meta.stream,
            consumer=meta.consumer,
            stream_sequence=meta.sequence.stream,
            consumer_sequence=meta.sequence.consumer,
            deliveries=meta.num_delivered,
            msg_id=headers.get(MSG_ID) or f"seq:{meta.sequence.stream}",
            headers=headers,
            cloud_event=cloud_event_attributes(headers),
        )

    def _remember(self, msg_id: str) -> None:
        self._done[msg_id] = None
        if len(self._done) > self._options.dedupe_window:
            self._done.popitem(last=False)

    async def _process(self, msg: Msg) -> None:
        delivery = self._delivery(msg)
        opts = self._options
        if delivery.msg_id in self._done:
            await self._ack(msg)
            self._m_duplicate.inc()
            return
        try:
            event = decode(msg.data)
        except DecodeError as exc:
            await self._dead_letter(msg, delivery, kind="decode", reason=str(exc))
            return
        if delivery.deliveries > opts.max_attempts:
            # Delivered more often than allowed without an outcome (the process died while
            # handling): do not risk another crash loop.
            reason = f"delivered {delivery.deliveries} times without being handled"
            await self._dead_letter(msg, delivery, kind="exhausted", reason=reason)
            return
        started = time.monotonic()
        self._current, self._current_since = msg, started
        try:
            with self._tracer.start_as_current_span(
                f"process {event.event_type()}",
                context=extract_headers(delivery.headers),
                kind=trace.SpanKind.CONSUMER,
                attributes={
                    "messaging.system": "nats",
                    "messaging.destination.name": delivery.subject,
                    "messaging.consumer.group.name": delivery.consumer,
                    "messaging.message.id": delivery.msg_id,
                },
            ) as span:
                try:
                    async with asyncio.timeout(opts.handler_timeout):
                        await self._handler(event, delivery)
                except PermanentError as exc:
                    span.record_exception(exc)
                    await self._dead_letter(msg, delivery, kind="permanent", reason=str(exc))
                    return
                except asyncio.CancelledError:
                    # Shutdown while handling: hand it back for immediate redelivery.
                    with contextlib.suppress(nats.errors.Error):
                        await msg.nak()
                    raise
                except Exception as exc:
                    span.record_exception(exc)
                    span.set_status(trace.StatusCode.ERROR, repr(exc))
                    await self._failed(msg, delivery, exc)
                    return
        finally:
            self._current = None
            self._m_seconds.observe(time.monotonic() - started)
        self._remember(delivery.msg_id)
        await self._ack(msg)
        self._m_acked.inc()

    async def _ack(self, msg: Msg) -> None:
        # A lost ack only means a redelivery, which the remembered msg id absorbs.
        try:
            await msg.ack()
        except nats.errors.Error as exc:
            log.warning("ack failed", extra={"consumer": self.spec.durable, "error": repr(exc)})

    async def _failed(self, msg: Msg, delivery: Delivery, exc: Exception) -> None:
        opts = self._options
        if isinstance(exc, TimeoutError):
            what = f"timed out after {opts.handler_timeout}s"
        else:
            what = f"raised {exc!r}"
        if delivery.deliveries >= opts.max_attempts:
            reason = f"handler {what} on delivery {delivery.deliveries} of {opts.max_attempts}"
            await self._dead_letter(msg, delivery, kind="handler", reason=reason)
            return
        pause = opts.backoff[min(delivery.deliveries - 1, len(opts.backoff) - 1)]
        log.warning(
            "handler failed, will retry",
            extra={
                "consumer": delivery.consumer,
                "subject": delivery.subject,
                "stream_sequence": delivery.stream_sequence,
                "delivery": delivery.deliveries,
                "retry_in": pause,
                "error": what,
            },
        )
        await msg.nak(delay=pause)
        self._m_retried.inc()

    async def _dead_letter(
        self, msg: Msg, delivery: Delivery, *, kind: DeadLetterKind, reason: str
    ) -> None:
        try:
            await publish_dead_letter(
                self._js,
                spec=self.spec,
                subject=delivery.subject,
                payload=msg.data,
                headers=delivery.headers,
                sequence=delivery.stream_sequence,
                deliveries=delivery.deliveries,
                kind=kind,
                reason=reason,
            )
        except nats.errors.Error as exc:
            # Never ack what is not safely stored elsewhere: try again later.
            log.error(
                "dead letter publish failed, message kept",
                extra={"consumer": delivery.consumer, "error": repr(exc)},
            )
            with contextlib.suppress(nats.errors.Error):
                await msg.nak(delay=self._options.backoff[-1])
            return
        log.error(
            "message dead-lettered",
            extra={
                "consumer": delivery.consumer,
                "subject": delivery.subject,
                "stream_sequence": delivery.stream_sequence,
                "kind": kind,
                "reason": reason,
            },
        )
        self._remember(delivery.msg_id)
        await self._ack(msg)
        self._m_dead.inc()
