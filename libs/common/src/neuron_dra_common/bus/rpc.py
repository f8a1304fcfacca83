"""Request/reply over core NATS, with events as payloads and the trace carried along.

Request subjects live under ``neuron.rpc.`` where no stream listens: a stream that stored a
request would answer it with a JetStream ack before the responder could. What must outlive
the exchange (a decision) the responder publishes to its stream itself.

>>> responder = Responder(bus, ALLOCATOR_SUBJECT, handle, queue="topology-allocator")
>>> await responder.start()
>>> decided = await request(bus, ALLOCATOR_SUBJECT, AllocationRequested(...), wait=5)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Final

import nats.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from opentelemetry import trace

from neuron_dra_common.bus.connection import Bus
from neuron_dra_common.bus.errors import PermanentError
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
    requests race. Replicas share the load through ``queue``.
    """

    def __init__(self, bus: Bus, subject: str, handler: RpcHandler, *, queue: str = "") -> None:
        self._bus = bus
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
                answer = await self._handler(decode(msg.data))
            except (DecodeError, PermanentError, ValueError) as exc:
                await self._reply(msg, error=str(exc))
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # The requester retries; say what happened rather than leave it waiting.
                span.record_exception(exc)
                log.exception("rpc handler failed", extra={"subject": self._subject})
                await self._reply(msg, error=f"{self._subject}: handler failed: {exc!r}")
                return
            await self._reply(msg, payload=encode(answer))

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
