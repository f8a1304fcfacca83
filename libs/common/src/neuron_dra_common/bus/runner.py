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

Acks are explicit, one per message, sent only after its handler returned; the acks of the
messages handled in one turn of the event loop are written together (a handler that awaits
anything lets them go out at once). A message whose handler failed is never acked: it is
nak'd with its backoff, or dead-lettered and only then acked.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import time
from bisect import bisect_left
from collections.abc import Awaitable, Callable
from typing import Final

import msgspec
import nats.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from opentelemetry import context as otel_context
from opentelemetry import trace

from neuron_dra_common.bus import metrics
from neuron_dra_common.bus.deadletter import DeadLetterKind, publish_dead_letter
from neuron_dra_common.bus.declarations import ConsumerSpec
from neuron_dra_common.bus.errors import PermanentError
from neuron_dra_common.bus.headers import MSG_ID, CloudEventAttributes, cloud_event_attributes
from neuron_dra_common.bus.reconcile import reconcile_consumer
from neuron_dra_common.bus.wire import (
    STATUS,
    RawMsg,
    Wire,
    ack_metadata,
    parse_header_block,
    pub,
    pub_reply,
)
from neuron_dra_common.events.codec import AnyEvent, DecodeError, decode
from neuron_dra_common.telemetry.propagation import extract_headers
from neuron_dra_common.telemetry.tracing import get_tracer

__all__ = ["ConsumerRunner", "Delivery", "Handler", "RunnerOptions"]

log = logging.getLogger(__name__)

_PAUSE_AFTER_ERROR: Final = 0.5
_TRACEPARENT: Final = "traceparent"

#: One delivery as it came off the wire: subject, reply (the ack subject), payload, headers.
_Raw = RawMsg


def _may_record(tracer: trace.Tracer) -> bool:
    """False when spans of ``tracer`` can only be no-ops (no tracer provider configured)."""
    if isinstance(tracer, trace.NoOpTracer):
        return False
    if isinstance(tracer, trace.ProxyTracer):
        # Resolves to the process-wide provider once one is set.
        provider = trace.get_tracer_provider()
        return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)
    return True


def _ack_command(reply: bytes) -> bytes:
    return b"PUB %b 4\r\n+ACK\r\n" % reply


def _nak_command(reply: bytes, delay: float = 0.0) -> bytes:
    payload = b"-NAK"
    if delay > 0:
        payload += b' {"delay": %d}' % int(delay * 1e9)
    return pub(reply.decode(), payload)


class Delivery(msgspec.Struct, frozen=True, kw_only=True, dict=True):
    """Where a message came from and how often it was delivered, for idempotent handlers.

    ``stream_sequence`` is unique and increasing per stream; ``msg_id`` is the publisher's
    de-duplication id (stable across a publisher's retries). ``headers`` and
    ``cloud_event`` are read from the message's raw header block when first asked for.
    """

    subject: str
    stream: str
    consumer: str
    stream_sequence: int
    consumer_sequence: int
    deliveries: int
    msg_id: str
    raw_headers: bytes = b""

    @property
    def redelivered(self) -> bool:
        return self.deliveries > 1

    @functools.cached_property
    def headers(self) -> dict[str, str]:
        """The message's headers as sent."""
        return parse_header_block(self.raw_headers) if self.raw_headers else {}

    @functools.cached_property
    def cloud_event(self) -> CloudEventAttributes | None:
        """The CloudEvents attributes of the message, ``None`` if a required one is missing."""
        return cloud_event_attributes(self.headers)


def _header_value(block: bytes, marker: bytes) -> str | None:
    """The value of one header found by ``marker`` (``b"\\r\\nName:"``), without a full parse."""
    start = block.find(marker)
    if start < 0:
        return None
    start += len(marker)
    end = block.find(b"\r\n", start)
    return block[start:end].decode("utf-8", "replace").strip()


_MSG_ID_MARKER: Final = b"\r\n" + MSG_ID.encode() + b":"
_TRACEPARENT_MARKER: Final = b"\r\n" + _TRACEPARENT.encode() + b":"


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
    ``dedupe_window`` is how many handled msg ids the runner remembers at least (the last
    ``dedupe_window`` always; up to twice as many).
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
        self._wire = Wire.of(nc)
        self._handler = handler
        self._options = options or RunnerOptions()
        self._stop_requested = False
        self._ready = False
        # Handled msg ids in two generations: the current one fills up to dedupe_window,
        # then becomes the previous one (the one before is forgotten).
        self._seen: set[str] = set()
        self._seen_before: set[str] = set()
        # The ack subject prefix of this consumer's deliveries (no JetStream domain), whose
        # numbers are read without a full parse.
        self._ack_prefix = f"$JS.ACK.{spec.stream}.{spec.durable}.".encode()
        self._tracer = tracer or get_tracer()
        self._current: bytes | None = None
        self._current_since = 0.0
        self._wake: asyncio.Future[None] | None = None
        self._acks: list[bytes] = []
        self._acks_scheduled = False
        self._acked = 0
        self._task: asyncio.Task[None] | None = None
        self._calls = 0
        self._handling = 0
        self._handling_since = 0.0
        self._timed_out = 0
        self._watchdog: asyncio.TimerHandle | None = None
        self._recording = True
        self._recording_checked = -1e9
        self._interrupted: bytes | None = None
        name = spec.durable
        self._m_acked = metrics.MESSAGES.labels(name, "acked")
        self._m_retried = metrics.MESSAGES.labels(name, "retried")
        self._m_duplicate = metrics.MESSAGES.labels(name, "duplicate")
        self._m_dead = metrics.MESSAGES.labels(name, "dead_lettered")
        self._m_requeued = metrics.MESSAGES.labels(name, "requeued")
        self._times = metrics.HandleTimes(name)

    @property
    def ready(self) -> bool:
        """True once the consumer exists and the runner is fetching."""
        return self._ready

    def stop(self) -> None:
        """Finish the message in hand, hand back the rest of the batch, then return from run."""
        self._stop_requested = True
        self._wakeup()

    def _wakeup(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    async def _wait(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        self._wake = loop.create_future()
        timer = loop.call_later(seconds, self._wakeup)
        try:
            await self._wake
        finally:
            timer.cancel()
            self._wake = None

    async def run(self) -> None:
        """Reconcile the consumer, then pull and handle until stopped.

        Pull requests are kept outstanding ahead of the handler (a new one whenever fewer
        than half a batch is still owed), so messages stream in without a round trip per
        batch. Requests lost with a connection are noticed by the reconnect count.
        """
        await reconcile_consumer(self._js, self.spec)
        self._task = asyncio.current_task()
        nc, opts = self._nc, self._options
        queue: collections.deque[_Raw] = collections.deque()

        inbox = nc.new_inbox()
        # Deliveries queue up as the parser reads them; the runner is woken once per read.
        sub = await self._wire.subscribe(inbox, queue.append, after_read=self._wakeup)
        next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{self.spec.stream}.{self.spec.durable}"
        expires = max(1.0, opts.fetch_timeout * 5)
        request = pub_reply(
            next_subject,
            inbox,
            msgspec.json.encode({"batch": opts.batch, "expires": int(expires * 1e9)}),
        )
        progress = asyncio.create_task(
            self._progress_loop(), name=f"bus-progress-{self.spec.durable}"
        )
        owed = 0
        refill = opts.batch // 2
        reconnects = nc.stats["reconnects"]
        last_seen = time.monotonic()
        process, popleft = self._process, queue.popleft
        self._ready = True
        try:
            while not self._stop_requested:
                if nc.stats["reconnects"] != reconnects:
                    reconnects, owed = nc.stats["reconnects"], 0
                if owed <= refill and nc.is_connected:
                    try:
                        await self._wire.send(request)
                        owed += opts.batch
                    except nats.errors.Error as exc:
                        log.warning("pull request failed", extra={"error": repr(exc)})
                        await asyncio.sleep(_PAUSE_AFTER_ERROR)
                        continue
                if not queue:
                    await self._wait(opts.fetch_timeout)
                    if not queue:
                        if time.monotonic() - last_seen > expires + 1:
                            owed = 0  # requests expired without a word (server restarted)
                        continue
                last_seen = time.monotonic()
                # What has arrived, until it runs out, a stop, or the next pull request is due.
                while queue and not self._stop_requested:
                    subject, reply, data, raw_headers = popleft()
                    if not data and raw_headers and raw_headers[8:9] == b" ":
                        # "NATS/1.0 408 ...": a status of the pull request, not a message.
                        headers = parse_header_block(raw_headers)
                        owed = _owed_after_status(owed, headers.get(STATUS, ""), headers)
                        continue
                    owed -= 1
                    await process(subject, reply, data, raw_headers or b"")
                    if owed <= refill:
                        break
                last_seen = time.monotonic()
        finally:
            self._ready = False
            if self._watchdog is not None:
                self._watchdog.cancel()
                self._watchdog = None
            progress.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await progress
            # Unsubscribed first: the server then drops the pull requests still open for this
            # inbox, so what is handed back goes to another runner rather than to this one.
            with contextlib.suppress(nats.errors.Error):
                await self._wire.unsubscribe(sub)
            left = [r for _, r, data, raw in queue if data or not raw or raw[8:9] != b" "]
            if self._interrupted is not None:
                left.insert(0, self._interrupted)
                self._interrupted = None
            queue.clear()
            self._count_acked()
            self._times.flush()
            await self._flush_acks()
            await self._requeue(left)

    async def _requeue(self, replies: list[bytes]) -> None:
        # Handing back at once lets another instance take them without waiting for ack_wait.
        if not replies:
            return
        with contextlib.suppress(nats.errors.Error):
            await self._wire.send(b"".join(_nak_command(r) for r in replies if r))
        self._m_requeued.inc(len(replies))

    async def _progress_loop(self) -> None:
        interval = self._options.progress_interval or self.spec.ack_wait_seconds / 3
        while True:
            await asyncio.sleep(interval)
            reply = self._current
            if reply is not None and time.monotonic() - self._current_since >= interval:
                with contextlib.suppress(nats.errors.Error):
                    await self._wire.send(pub(reply.decode(), b"+WPI"))

    def _delivery(self, subject: bytes, reply: bytes, raw_headers: bytes) -> Delivery | None:
        """The delivery a message's ack subject describes; ``None`` if it is not one."""
        stream, consumer = self.spec.stream, self.spec.durable
        numbers = None
        if reply.startswith(self._ack_prefix):
            # <delivered>.<stream seq>.<consumer seq>.<timestamp>.<pending>
            numbers = reply[len(self._ack_prefix) :].split(b".")
            if len(numbers) != 5 or not numbers[0].isdigit():
                numbers = None
        if numbers is not None:
            try:
                deliveries, stream_sequence = int(numbers[0]), int(numbers[1])
                consumer_sequence = int(numbers[2])
            except ValueError:
                return None
        else:
            meta = ack_metadata(reply.decode("utf-8", "replace"))
            if meta is None:
                return None
            stream, consumer = meta.stream, meta.consumer
            deliveries, stream_sequence = meta.deliveries, meta.stream_sequence
            consumer_sequence = meta.consumer_sequence
        return Delivery(
            subject=subject.decode(),
            stream=stream,
            consumer=consumer,
            stream_sequence=stream_sequence,
            consumer_sequence=consumer_sequence,
            deliveries=deliveries,
            msg_id=_header_value(raw_headers, _MSG_ID_MARKER) or f"seq:{stream_sequence}",
            raw_headers=raw_headers,
        )

    def _remember(self, msg_id: str) -> None:
        seen = self._seen
        seen.add(msg_id)
        if len(seen) >= self._options.dedupe_window:
            self._seen_before, self._seen = seen, set()

    async def _process(self, subject: bytes, reply: bytes, data: bytes, raw_headers: bytes) -> None:
        delivery = self._delivery(subject, reply, raw_headers)
        if delivery is None:
            log.error(
                "not a JetStream delivery, dropped",
                extra={"consumer": self.spec.durable, "reply": reply[:200]},
            )
            return
        opts = self._options
        msg_id = delivery.msg_id
        if msg_id in self._seen or msg_id in self._seen_before:
            self._ack(reply)
            self._m_duplicate.inc()
            return
        try:
            event = decode(data)
        except DecodeError as exc:
            await self._dead_letter(reply, data, delivery, kind="decode", reason=str(exc))
            return
        if delivery.deliveries > opts.max_attempts:
            # Delivered more often than allowed without an outcome (the process died while
            # handling): do not risk another crash loop.
            reason = f"delivered {delivery.deliveries} times without being handled"
            await self._dead_letter(reply, data, delivery, kind="exhausted", reason=reason)
            return
        started = time.monotonic()
        self._current, self._current_since = reply, started
        # Continue the publisher's trace. With no tracer configured no span is made, but the
        # publisher's context is made current, so what the handler publishes stays in it.
        parent = (
            extract_headers(delivery.headers)
            if raw_headers.find(_TRACEPARENT_MARKER) >= 0
            else None
        )
        if started - self._recording_checked > 1.0:
            # Looked up once a second: finding the process-wide provider reads the environment.
            self._recording_checked = started
            self._recording = _may_record(self._tracer)
        span: trace.Span = trace.INVALID_SPAN
        recording = False
        token = None
        if self._recording:
            span = self._tracer.start_span(
                f"process {event.event_type()}",
                context=parent,
                kind=trace.SpanKind.CONSUMER,
                attributes={
                    "messaging.system": "nats",
                    "messaging.destination.name": delivery.subject,
                    "messaging.consumer.group.name": delivery.consumer,
                    "messaging.message.id": msg_id,
                },
            )
            recording = span.is_recording()
        if recording or parent is not None:
            token = otel_context.attach(trace.set_span_in_context(span, parent))
        # The handler runs under the watchdog (see _check_timeout): one timer serves many
        # calls, as a timer per call would cost more than a fast handler.
        self._calls += 1
        call = self._handling = self._calls
        self._handling_since = started
        if self._watchdog is None:
            self._watchdog = asyncio.get_running_loop().call_later(
                opts.handler_timeout, self._check_timeout
            )
        try:
            try:
                await self._handler(event, delivery)
            except asyncio.CancelledError:
                if self._timed_out != call:
                    raise
                self._timed_out = 0
                task = asyncio.current_task()
                if task is not None and task.uncancel() > 0:
                    raise  # cancelled from outside as well: shutting down
                raise TimeoutError(f"handler ran over {opts.handler_timeout}s") from None
            finally:
                self._handling = 0
                if self._timed_out == call:
                    # The handler swallowed its cancellation and returned: nothing to undo
                    # but the request itself.
                    self._timed_out = 0
                    task = asyncio.current_task()
                    if task is not None:
                        task.uncancel()
        except PermanentError as exc:
            span.record_exception(exc)
            await self._dead_letter(reply, data, delivery, kind="permanent", reason=str(exc))
            return
        except asyncio.CancelledError:
            # Shutdown while handling: handed back (nak'd) by run once it stopped pulling.
            self._interrupted = reply
            raise
        except Exception as exc:
            span.record_exception(exc)
            span.set_status(trace.StatusCode.ERROR, repr(exc))
            await self._failed(reply, data, delivery, exc)
            return
        finally:
            if token is not None:
                otel_context.detach(token)
            if recording:
                span.end()
            self._current = None
            seconds = time.monotonic() - started
            times = self._times
            times.counts[bisect_left(times.bounds, seconds)] += 1
            times.total += seconds
            if not self._acks_scheduled:
                # Acks and handler times of this turn go out when the loop next turns.
                self._acks_scheduled = True
                asyncio.get_running_loop().call_soon(self._write_acks)
        # _remember and _ack, written out: this is the path every message takes.
        seen = self._seen
        seen.add(msg_id)
        if len(seen) >= opts.dedupe_window:
            self._seen_before, self._seen = seen, set()
        self._acks.append(b"PUB %b 4\r\n+ACK\r\n" % reply)
        self._acked += 1

    def _check_timeout(self) -> None:
        """The watchdog: cancel a handler call that ran past its deadline, or re-arm.

        Armed for the first call after an idle spell; when it fires it either cancels the
        call still running past ``handler_timeout`` or re-arms for the call in hand.
        """
        self._watchdog = None
        call = self._handling
        if not call:
            return  # idle: the next call arms it again
        left = self._handling_since + self._options.handler_timeout - time.monotonic()
        if left > 0:
            self._watchdog = asyncio.get_running_loop().call_later(left, self._check_timeout)
            return
        # A callback runs only while the runner's task waits, and it waits inside the
        # handler while one is in hand: the cancellation lands there.
        if self._task is not None and not self._task.done():
            self._timed_out = call
            self._task.cancel()

    def _ack(self, reply: bytes) -> None:
        """Ack once the loop next turns, together with the other acks of this turn."""
        self._acks.append(_ack_command(reply))
        if not self._acks_scheduled:
            self._acks_scheduled = True
            asyncio.get_running_loop().call_soon(self._write_acks)

    def _write_acks(self) -> None:
        self._acks_scheduled = False
        self._count_acked()
        self._times.flush()
        if not self._acks:
            return
        commands, self._acks = b"".join(self._acks), []
        try:
            self._wire.send_nowait(commands)
        except nats.errors.Error as exc:
            # A lost ack only means a redelivery, which the remembered msg id absorbs.
            log.warning("ack failed", extra={"consumer": self.spec.durable, "error": repr(exc)})

    def _count_acked(self) -> None:
        if self._acked:
            self._m_acked.inc(self._acked)
            self._acked = 0

    async def _flush_acks(self) -> None:
        # A lost ack only means a redelivery, which the remembered msg id absorbs.
        commands, self._acks = b"".join(self._acks), []
        if not commands:
            return
        try:
            await self._wire.send(commands)
        except nats.errors.Error as exc:
            log.warning("ack failed", extra={"consumer": self.spec.durable, "error": repr(exc)})

    async def _failed(self, reply: bytes, data: bytes, delivery: Delivery, exc: Exception) -> None:
        opts = self._options
        if isinstance(exc, TimeoutError):
            what = f"timed out after {opts.handler_timeout}s"
        else:
            what = f"raised {exc!r}"
        if delivery.deliveries >= opts.max_attempts:
            reason = f"handler {what} on delivery {delivery.deliveries} of {opts.max_attempts}"
            await self._dead_letter(reply, data, delivery, kind="handler", reason=reason)
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
        with contextlib.suppress(nats.errors.Error):
            await self._wire.send(_nak_command(reply, pause))
        self._m_retried.inc()

    async def _dead_letter(
        self, reply: bytes, data: bytes, delivery: Delivery, *, kind: DeadLetterKind, reason: str
    ) -> None:
        try:
            await publish_dead_letter(
                self._js,
                spec=self.spec,
                subject=delivery.subject,
                payload=data,
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
                await self._wire.send(_nak_command(reply, self._options.backoff[-1]))
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
        self._ack(reply)
        self._m_dead.inc()
