"""Request/reply over core NATS, with events as payloads and the trace carried along.

Request subjects live under ``neuron.rpc.`` where no stream listens: a stream that stored a
request would answer it with a JetStream ack before the responder could. What must outlive
the exchange (a decision) the responder publishes to its stream itself.

A request the responder refuses (too large, not an event, not a type it answers) or cannot
handle gets an error reply naming the problem, and goes to the responder's dead letter
(``neuron.deadletter.RPC.<name>``) with the same reason.

>>> responder = Responder(bus, ALLOCATOR_SUBJECT, handle, name="topology-allocator-rpc",
...                       accepts=(AllocationRequested, AllocationReleased))
>>> await responder.start()
>>> decided = await request(bus, ALLOCATOR_SUBJECT, AllocationRequested(...), wait=5)
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Final

import nats.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from opentelemetry import trace

from neuron_dra_common.bus.connection import Bus
from neuron_dra_common.bus.deadletter import DeadLetterKind, publish_dead_letter
from neuron_dra_common.bus.declarations import RPC_STREAM, reader
from neuron_dra_common.bus.errors import PermanentError, RetryLater
from neuron_dra_common.bus.intake import Refused, admit
from neuron_dra_common.events.base import SUBJECT_ROOT, Event
from neuron_dra_common.events.codec import AnyEvent, DecodeError, decode, encode
from neuron_dra_common.telemetry.propagation import extract_headers, inject_headers
from neuron_dra_common.telemetry.tracing import get_tracer

__all__ = ["ALLOCATOR_SUBJECT", "ERROR_HEADER", "RPC_ROOT", "Responder", "RpcError", "request"]

log = logging.getLogger(__name__)

RPC_ROOT: Final = f"{SUBJECT_ROOT}.rpc"
#: The topology allocator: AllocationRequested -> AllocationDecided,
#: AllocationReleased -> AllocationReleased (what was actually given back).
ALLOCATOR_SUBJECT: Final = f"{RPC_ROOT}.allocator"
#: Set on a reply that carries an error message instead of an event.
ERROR_HEADER: Final = "Neuron-Error"

RpcHandler = Callable[[AnyEvent], Awaitable[Event]]


class RpcError(Exception):
    """No answer, or the responder answered with an error (the message says which)."""


class Responder:
    """Answers requests on ``subject`` one at a time, in arrival order.

    One at a time on purpose: a responder that decides (an allocator) must never see two
    requests race. Replicas share the load through ``queue``. ``accepts`` are the event types
    it answers; ``name`` says whose dead letters the refused requests are.
    """

    def __init__(
        self,
        bus: Bus,
        subject: str,
        handler: RpcHandler,
        *,
        name: str,
        accepts: tuple[type[Event], ...],
        queue: str = "",
    ) -> None:
        if not accepts:
            raise ValueError(f"responder {name}: accepts names no event type")
        self._bus = bus
        self._spec = reader(RPC_STREAM, name)
        self._accepts = accepts
        self._subject = subject
        self._handler = handler
        self._queue = queue
        self._sub: Subscription | None = None
        self._tracer = get_tracer()

    @property
    def ready(self) -> bool:
        return self._sub is not None and self._bus.connected

    async def start(self) -> None:
        self._sub = await self._bus.nc.subscribe(self._subject, queue=self._queue, cb=self._on)

    async def stop(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            try:
                await sub.drain()  # type: ignore[no-untyped-call]
            except nats.errors.Error as exc:
                log.warning("responder drain failed", extra={"error": repr(exc)})

    async def _on(self, msg: Msg) -> None:
        if not msg.reply:
            return
        with self._tracer.start_as_current_span(
            f"rpc {self._subject}",
            context=extract_headers(msg.headers),
            kind=trace.SpanKind.SERVER,
        ) as span:
            try:
                event = admit(
                    msg.data, subject=msg.subject, limits=self._bus.limits, accepts=self._accepts
                )
            except Refused as exc:
                await self._refuse(msg, kind=exc.kind, reason=str(exc))
                return
            try:
                answer = await self._handler(event)
            except RetryLater as exc:
                await self._reply(msg, error=str(exc))
                return
            except (PermanentError, ValueError) as exc:
                await self._refuse(msg, kind="permanent", reason=str(exc))
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # The requester retries; say what happened rather than leave it waiting.
                span.record_exception(exc)
                log.exception("rpc handler failed", extra={"subject": self._subject})
                reason = f"{self._subject}: handler failed: {exc!r}"
                await self._refuse(msg, kind="handler", reason=reason)
                return
            await self._reply(msg, payload=encode(answer))

    async def _refuse(self, msg: Msg, *, kind: DeadLetterKind, reason: str) -> None:
        """Answer with the reason, and keep the request as a dead letter."""
        await self._reply(msg, error=reason)
        try:
            await publish_dead_letter(
                self._bus.js,
                spec=self._spec,
                subject=msg.subject,
                payload=msg.data,
                headers=msg.headers,
                sequence=0,
                deliveries=1,
                kind=kind,
                reason=reason,
                # Requests have no stream sequence: each refusal is its own dead letter.
                msg_id=f"dl:{RPC_STREAM}:{self._spec.durable}:{uuid.uuid4().hex}",
            )
        except nats.errors.Error as exc:
            # The requester has the reason already; what is lost is the copy for people.
            log.error(
                "rpc dead letter not stored",
                extra={"responder": self._spec.durable, "reason": reason, "error": repr(exc)},
            )

    async def _reply(self, msg: Msg, *, payload: bytes = b"", error: str = "") -> None:
        headers = {ERROR_HEADER: error[:4000]} if error else None
        try:
            await self._bus.nc.publish(msg.reply, payload, headers=headers)
        except nats.errors.Error as exc:
            log.warning("rpc reply lost", extra={"subject": self._subject, "error": repr(exc)})


async def request(bus: Bus, subject: str, event: Event, *, wait: float = 5.0) -> AnyEvent:
    """Send ``event`` to the responder of ``subject`` and return its answer.

    Raises :class:`RpcError` when nobody answers in time or the answer is an error.
    """
    tracer = get_tracer()
    with tracer.start_as_current_span(f"rpc {subject}", kind=trace.SpanKind.CLIENT):
        headers: dict[str, str] = {}
        inject_headers(headers)
        try:
            msg = await bus.nc.request(subject, encode(event), timeout=wait, headers=headers)
        except nats.errors.NoRespondersError:
            raise RpcError(f"{subject}: no responder is running") from None
        except (nats.errors.TimeoutError, TimeoutError):
            raise RpcError(f"{subject}: no answer within {wait}s") from None
        error = (msg.headers or {}).get(ERROR_HEADER)
        if error:
            raise RpcError(error)
        try:
            return decode(msg.data)
        except DecodeError as exc:
            raise RpcError(f"{subject}: answer is not an event: {exc}") from None
