"""A durable consumer runner: decode, handle, ack; retry with backoff; dead-letter.

What a handler can count on:
- it sees each stored message until it returns without raising; a failure is retried after
  ``backoff`` and, once ``max_attempts`` deliveries failed, the message goes to the dead
  letter with the reason (so does, at once, a message :func:`~.intake.admit` refuses: one
  that is too large, does not decode, or does not belong on its subject);
- a message it already handled in this process is acked again without calling it (a lost
  ack after a NATS restart); across processes it gets :class:`Delivery` (stream sequence,
  msg id, delivery count) to make its own effects idempotent;
- it runs inside a span that continues the publisher's trace, and a slow handler keeps the
  message from being redelivered by in-progress acks.

Acks are explicit, one per message, sent only after its handler returned. A message whose
handler failed is never acked: it is nak'd with its backoff, or dead-lettered and only then
acked. Messages received but not handled when the runner stops are nak'd, so another
instance takes them at once rather than after the ack wait.

The server pushes the consumer's messages to its deliver subject, in a deliver group shared
by the service's instances (see :class:`~.declarations.ConsumerSpec`). Everything here goes
through nats-py's public JetStream API: ``subscribe_bind`` with a callback that only queues
the message for the runner's task, and the message's own ``ack``/``nak``/``in_progress``.
A consumer deleted under a running service is created again within ``progress_interval``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Final, get_args

import msgspec
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from opentelemetry import context as otel_context
from opentelemetry import trace

from neuron_dra_common.bus import metrics
from neuron_dra_common.bus.deadletter import DeadLetterKind, publish_dead_letter
from neuron_dra_common.bus.declarations import ConsumerSpec, published_subject
from neuron_dra_common.bus.errors import PermanentError
from neuron_dra_common.bus.headers import MSG_ID, CloudEventAttributes, cloud_event_attributes
from neuron_dra_common.bus.intake import IntakeLimits, Refused, admit
from neuron_dra_common.bus.reconcile import consumer_config, reconcile_consumer
from neuron_dra_common.events.codec import AnyEvent
from neuron_dra_common.telemetry.propagation import extract_headers
from neuron_dra_common.telemetry.tracing import get_tracer

__all__ = ["ConsumerRunner", "Delivery", "Handler", "RunnerOptions", "ack_numbers"]

log = logging.getLogger(__name__)

_TRACEPARENT: Final = "traceparent"


def _may_record(tracer: trace.Tracer) -> bool:
    """False when spans of ``tracer`` can only be no-ops (no tracer provider configured)."""
    if isinstance(tracer, trace.NoOpTracer):
        return False
    if isinstance(tracer, trace.ProxyTracer):
        # Resolves to the process-wide provider once one is set.
        provider = trace.get_tracer_provider()
        return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)
    return True


def ack_numbers(reply: str) -> tuple[int, int, int] | None:
    """(deliveries, stream sequence, consumer sequence) read from a JetStream ack subject.

    The subject is ``$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.
    <time>.<pending>``, or with ``<domain>.<account hash>`` before the stream and a token
    after ``<pending>``. The same numbers as nats-py's ``Msg.metadata``, without building
    the rest of it for every message; ``None`` when the subject has neither form.
    """
    tokens = reply.split(".")
    count = len(tokens)
    if count == 9:
        first = 4
    elif count >= 11:
        first = 6
    else:
        return None
    if tokens[0] != "$JS" or tokens[1] != "ACK":
        return None
    try:
        return int(tokens[first]), int(tokens[first + 1]), int(tokens[first + 2])
    except ValueError:
        return None


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
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    #: The message's payload as stored (what ``event`` was decoded from).
    payload: bytes = b""

    @property
    def redelivered(self) -> bool:
        return self.deliveries > 1

    @property
    def cloud_event(self) -> CloudEventAttributes | None:
        """The CloudEvents attributes of the message, ``None`` if a required one is missing."""
        return cloud_event_attributes(self.headers)


Handler = Callable[[AnyEvent, Delivery], Awaitable[None]]


class RunnerOptions(msgspec.Struct, frozen=True, kw_only=True):
    """How a runner retries and times out.

    ``backoff[i]`` is the pause before delivery ``i + 2``; the last value repeats.
    ``progress_interval`` defaults to a third of the consumer's ack wait; it is also how
    often the runner checks that its consumer still exists.
    ``dedupe_window`` is how many handled msg ids the runner remembers at least (the last
    ``dedupe_window`` always; up to twice as many).
    """

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
        limits: IntakeLimits | None = None,
        tracer: trace.Tracer | None = None,
    ) -> None:
        self.spec = spec
        self._limits = limits or IntakeLimits()
        self._js: JetStreamContext = nc.jetstream()
        self._handler = handler
        self._options = options or RunnerOptions()
        self._stop_requested = False
        self._ready = False
        # Handled msg ids in two generations: the current one fills up to dedupe_window,
        # then becomes the previous one (the one before is forgotten).
        self._seen: set[str] = set()
        self._seen_before: set[str] = set()
        self._tracer = tracer or get_tracer()
        self._current: Msg | None = None
        self._current_since = 0.0
        self._wake: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._calls = 0
        self._handling = 0
        self._handling_since = 0.0
        self._timed_out = 0
        self._watchdog: asyncio.TimerHandle | None = None
        self._recording = True
        self._recording_checked = -1e9
        self._interrupted: Msg | None = None
        # Pushed by the server, waiting for the runner's task (see _arrived).
        self._inbox: deque[Msg] = deque()
        self._acked = 0  # counted per message, added to the metric per run of the inbox
        name = spec.durable
        self._m_acked = metrics.MESSAGES.labels(name, "acked")
        self._m_retried = metrics.MESSAGES.labels(name, "retried")
        self._m_duplicate = metrics.MESSAGES.labels(name, "duplicate")
        self._m_dead = metrics.MESSAGES.labels(name, "dead_lettered")
        self._m_requeued = metrics.MESSAGES.labels(name, "requeued")
        self._m_seconds = metrics.HANDLE_SECONDS.labels(name)
        # Every series exists from the start at 0, so the first dead letter is an increase
        # an alert sees, not the birth of a series.
        for kind in get_args(DeadLetterKind):
            metrics.DEAD_LETTERS.labels(name, kind)

    @property
    def ready(self) -> bool:
        """True once the consumer exists and the runner is subscribed to its deliveries."""
        return self._ready

    def stop(self) -> None:
        """Finish the message in hand, hand back the ones received, then return from run."""
        self._stop_requested = True
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    async def _delivered(self, msg: Msg) -> None:
        # nats-py's callback: it only queues, so the client's reader never waits on a handler
        # and the handler runs in the runner's task (where its timeout can cancel it).
        self._inbox.append(msg)
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    async def _idle(self) -> None:
        """Wait until a message arrives or :meth:`stop` is called."""
        self._wake = asyncio.get_running_loop().create_future()
        try:
            await self._wake
        finally:
            self._wake = None

    async def run(self) -> None:
        """Reconcile the consumer, then handle what the server pushes until stopped."""
        await reconcile_consumer(self._js, self.spec)
        self._task = asyncio.current_task()
        sub = await self._js.subscribe_bind(
            stream=self.spec.stream,
            consumer=self.spec.durable,
            config=consumer_config(self.spec),
            cb=self._delivered,
            manual_ack=True,
        )
        progress = asyncio.create_task(
            self._progress_loop(), name=f"bus-progress-{self.spec.durable}"
        )
        inbox = self._inbox
        self._ready = True
        try:
            while not self._stop_requested:
                if not inbox:
                    await self._idle()
                    continue
                process = self._process
                try:
                    while inbox and not self._stop_requested:
                        await process(inbox.popleft())
                finally:
                    self._m_acked.inc(self._acked)
                    self._acked = 0
        finally:
            self._ready = False
            if self._watchdog is not None:
                self._watchdog.cancel()
                self._watchdog = None
            progress.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await progress
            # No more deliveries; what the server already sent reaches the inbox first.
            with contextlib.suppress(nats.errors.Error):
                await sub.drain()  # type: ignore[no-untyped-call]
            left = list(inbox)
            inbox.clear()
            if self._interrupted is not None:
                left.insert(0, self._interrupted)
                self._interrupted = None
            await self._requeue(left)

    async def _requeue(self, msgs: list[Msg]) -> None:
        # Handing back at once lets another instance take them without waiting for ack_wait.
        for msg in msgs:
            with contextlib.suppress(nats.errors.Error):
                await msg.nak()
        if msgs:
            self._m_requeued.inc(len(msgs))

    async def _progress_loop(self) -> None:
        interval = self._options.progress_interval or self.spec.ack_wait_seconds / 3
        while True:
            await asyncio.sleep(interval)
            msg = self._current
            if msg is not None and time.monotonic() - self._current_since >= interval:
                with contextlib.suppress(nats.errors.Error):
                    await msg.in_progress()
            await self._check_consumer()

    async def _check_consumer(self) -> None:
        """Create the consumer again if it was deleted: it pushes to the same subscription."""
        try:
            await self._js.consumer_info(self.spec.stream, self.spec.durable)
        except NotFoundError:
            log.warning(
                "consumer gone, creating it again",
                extra={"stream": self.spec.stream, "consumer": self.spec.durable},
            )
            try:
                await reconcile_consumer(self._js, self.spec)
            except Exception as exc:  # the next round tries again; the loop must go on
                log.warning(
                    "consumer not created again",
                    extra={"consumer": self.spec.durable, "error": repr(exc)},
                )
        except nats.errors.Error:
            pass  # reconnecting: the next round asks again

    def _delivery(self, msg: Msg) -> Delivery | None:
        """The delivery a message's ack subject describes; ``None`` if it is not one."""
        headers = msg.headers or {}
        numbers = ack_numbers(msg.reply)
        if numbers is not None:
            stream, consumer = self.spec.stream, self.spec.durable
            deliveries, stream_sequence, consumer_sequence = numbers
        else:
            try:
                meta = msg.metadata
            except nats.errors.Error:
                return None
            stream, consumer = meta.stream, meta.consumer
            deliveries = meta.num_delivered
            stream_sequence, consumer_sequence = meta.sequence.stream, meta.sequence.consumer
        return Delivery(
            subject=published_subject(msg.subject),
            stream=stream,
            consumer=consumer,
            stream_sequence=stream_sequence,
            consumer_sequence=consumer_sequence,
            deliveries=deliveries,
            msg_id=headers.get(MSG_ID) or f"seq:{stream_sequence}",
            headers=headers,
            payload=msg.data,
        )

    def _remember(self, msg_id: str) -> None:
        seen = self._seen
        seen.add(msg_id)
        if len(seen) >= self._options.dedupe_window:
            self._seen_before, self._seen = seen, set()

    async def _process(self, msg: Msg) -> None:
        delivery = self._delivery(msg)
        if delivery is None:
            log.error(
                "not a JetStream delivery, dropped",
                extra={"consumer": self.spec.durable, "reply": msg.reply[:200]},
            )
            return
        opts = self._options
        msg_id = delivery.msg_id
        if msg_id in self._seen or msg_id in self._seen_before:
            await self._ack(msg)
            self._m_duplicate.inc()
            return
        try:
            event = admit(msg.data, subject=msg.subject, limits=self._limits)
        except Refused as exc:
            await self._dead_letter(msg, delivery, kind=exc.kind, reason=str(exc))
            return
        if delivery.deliveries > opts.max_attempts:
            # Delivered more often than allowed without an outcome (the process died while
            # handling): do not risk another crash loop.
            reason = f"delivered {delivery.deliveries} times without being handled"
            await self._dead_letter(msg, delivery, kind="exhausted", reason=reason)
            return
        started = time.monotonic()
        self._current, self._current_since = msg, started
        # Continue the publisher's trace. With no tracer configured no span is made, but the
        # publisher's context is made current, so what the handler publishes stays in it.
        parent = extract_headers(delivery.headers) if _TRACEPARENT in delivery.headers else None
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
            await self._dead_letter(msg, delivery, kind="permanent", reason=str(exc))
            return
        except asyncio.CancelledError:
            # Shutdown while handling: handed back (nak'd) by run once it stopped receiving.
            self._interrupted = msg
            raise
        except Exception as exc:
            span.record_exception(exc)
            span.set_status(trace.StatusCode.ERROR, repr(exc))
            await self._failed(msg, delivery, exc)
            return
        finally:
            if token is not None:
                otel_context.detach(token)
            if recording:
                span.end()
            self._current = None
            self._m_seconds.observe(time.monotonic() - started)
        seen = self._seen
        seen.add(msg_id)
        if len(seen) >= opts.dedupe_window:
            self._seen_before, self._seen = seen, set()
        try:
            await msg.ack()
        except nats.errors.Error as exc:
            # A lost ack only means a redelivery, which the remembered msg id absorbs.
            log.warning("ack failed", extra={"consumer": self.spec.durable, "error": repr(exc)})
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

    async def _ack(self, msg: Msg) -> None:
        try:
            await msg.ack()
        except nats.errors.Error as exc:
            # A lost ack only means a redelivery, which the remembered msg id absorbs.
            log.warning("ack failed", extra={"consumer": self.spec.durable, "error": repr(exc)})

    async def _nak(self, msg: Msg, delay: float) -> None:
        with contextlib.suppress(nats.errors.Error):
            await msg.nak(delay=delay)

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
        await self._nak(msg, pause)
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
            await self._nak(msg, self._options.backoff[-1])
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
