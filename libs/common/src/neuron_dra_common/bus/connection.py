"""One NATS connection per process, that reconnects for ever, and what is built on it."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from opentelemetry import trace

from neuron_dra_common.bus.credentials import BusCredentials
from neuron_dra_common.bus.declarations import INBOX_ROOT, STREAMS, ConsumerSpec, StreamSpec
from neuron_dra_common.bus.intake import IntakeLimits
from neuron_dra_common.bus.publisher import Publisher
from neuron_dra_common.bus.reconcile import Change, reconcile
from neuron_dra_common.bus.runner import ConsumerRunner, Handler, RunnerOptions
from neuron_dra_common.telemetry.tracing import INSTRUMENTATION

__all__ = ["Bus", "lost_connections", "on_connection_lost"]

log = logging.getLogger(__name__)

#: Connections of this process that the server ended for good (``"<client>: <error>"``).
_LOST: list[str] = []
_LOST_LISTENERS: list[Callable[[str], None]] = []


def lost_connections(*, forget: bool = False) -> list[str]:
    """The connections the server ended for good since the last ``forget``.

    nats-py reconnects after a dropped socket, but ends a connection for good when the
    server refuses it with an error (an auth callout that answered too late after a server
    restart, a granted user whose time ran out): nothing on that client works again, so the
    process must start its service anew (:func:`neuron_dra_common.runtime.process.run`).
    """
    lost = list(_LOST)
    if forget:
        _LOST.clear()
    return lost


def on_connection_lost(listener: Callable[[str], None] | None) -> None:
    """Call ``listener`` with the reason when the server ends a connection for good
    (None: nobody)."""
    _LOST_LISTENERS.clear()
    if listener is not None:
        _LOST_LISTENERS.append(listener)


class Bus:
    """A connected bus: the JetStream context, publishers, consumer runners, and drain.

    >>> bus = await Bus.connect(["nats://127.0.0.1:4222"], name="slice-publisher")
    >>> await bus.reconcile(consumers=[consumer("slice-publisher-inventory")])
    >>> runner = bus.runner(consumer("slice-publisher-inventory"), handle)
    >>> await bus.close()
    """

    def __init__(
        self,
        nc: Client,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        limits: IntakeLimits | None = None,
    ) -> None:
        self.nc = nc
        self.closing = False
        #: What every consumer built on this bus accepts (runners, followers, responders).
        self.limits = limits or IntakeLimits()
        self.js: JetStreamContext = nc.jetstream()
        # None means the process-wide provider, looked up when a tracer is first needed.
        self._tracer = (
            tracer_provider.get_tracer(INSTRUMENTATION) if tracer_provider is not None else None
        )

    @classmethod
    async def connect(
        cls,
        servers: Sequence[str],
        *,
        name: str,
        connect_timeout: float = 5.0,
        reconnect_wait: float = 0.25,
        limits: IntakeLimits | None = None,
        credentials: BusCredentials | None = None,
        inbox: str = INBOX_ROOT,
    ) -> Bus:
        """Connect to NATS; after a server restart the client reconnects without limit.

        ``credentials``: the token (read again at each reconnect), user and TLS to use; None
        connects without any, as the local stack does. ``inbox``: where replies come back,
        the identity's own prefix (:func:`~neuron_dra_common.bus.declarations.inbox_prefix`);
        the auth callout lets an identity read replies under its own prefix only.
        """
        auth: dict[str, Any] = {}
        if credentials is not None:
            if credentials.token_file:
                # A callable: nats-py calls it at every connect, so a rotated token is used.
                auth["token"] = credentials.token
            if credentials.user:
                auth["user"] = credentials.user
                auth["password"] = credentials.password()
            tls = credentials.tls()
            if tls is not None:
                auth["tls"] = tls

        async def on_disconnected() -> None:
            log.warning("nats disconnected", extra={"client": name})

        async def on_reconnected() -> None:
            log.info("nats reconnected", extra={"client": name, "url": str(nc.connected_url)})

        bus: Bus | None = None

        async def on_closed() -> None:
            if bus is not None and bus.closing:
                return
            reason = f"{name}: {nc.last_error!r}"
            log.error(
                "nats ended this client's connection for good; the service starts again",
                extra={"client": name, "error": repr(nc.last_error)},
            )
            _LOST.append(reason)
            for listener in list(_LOST_LISTENERS):
                listener(reason)

        async def on_error(exc: Exception) -> None:
            text = str(exc)
            if (
                "permissions violation for subscription" in text.lower()
                and inbox.lower() in text.lower()
            ):
                # Every reply would time out: say why once, in the identity's terms.
                log.error(
                    "nats refused this client's reply inbox: the identity may only read "
                    "replies under its own prefix (_INBOX.<role> or _INBOX.<role>.<node>)",
                    extra={"client": name, "inbox": inbox, "error": text},
                )
                return
            log.warning("nats error", extra={"client": name, "error": repr(exc)})

        nc = await nats.connect(
            servers=list(servers),
            name=name,
            connect_timeout=connect_timeout,
            reconnect_time_wait=reconnect_wait,
            max_reconnect_attempts=-1,
            allow_reconnect=True,
            disconnected_cb=on_disconnected,
            reconnected_cb=on_reconnected,
            error_cb=on_error,
            closed_cb=on_closed,
            inbox_prefix=inbox,
            **auth,
        )
        bus = cls(nc, limits=limits)
        return bus

    @property
    def connected(self) -> bool:
        return bool(self.nc.is_connected)

    async def reconcile(
        self,
        *,
        streams: Iterable[StreamSpec] = STREAMS,
        consumers: Iterable[ConsumerSpec] = (),
        replicas: int = 1,
    ) -> dict[str, Change]:
        """Make streams and consumers match their declarations (idempotent).

        ``replicas``: the least number of copies of each stream (``stream_replicas``).
        """
        return await reconcile(self.js, streams=streams, consumers=consumers, replicas=replicas)

    async def answer(
        self, subject: str, handler: Callable[[bytes], Awaitable[bytes]]
    ) -> Callable[[], Awaitable[None]]:
        """Reply to every request on ``subject`` with ``handler``'s bytes (none when empty);
        returns what stops it. For protocol endpoints whose payloads are not events (the auth
        callout's); event requests go through :class:`~neuron_dra_common.bus.rpc.Responder`.
        """

        async def on_request(msg: Msg) -> None:
            reply = await handler(msg.data)
            if msg.reply and reply:
                await self.nc.publish(msg.reply, reply)

        sub = await self.nc.subscribe(subject, cb=on_request)
        return sub.unsubscribe

    def publisher(self, *, source: str, ack_timeout: float = 5.0) -> Publisher:
        """A publisher whose events carry ``source`` as their CloudEvents source."""
        return Publisher(self.js, source=source, ack_timeout=ack_timeout, tracer=self._tracer)

    def runner(
        self, spec: ConsumerSpec, handler: Handler, *, options: RunnerOptions | None = None
    ) -> ConsumerRunner:
        """A runner for ``spec``; start its ``run()`` as a named task."""
        return ConsumerRunner(
            self.nc, spec, handler, options=options, limits=self.limits, tracer=self._tracer
        )

    async def close(self) -> None:
        """Drain: flush what was published, finish subscriptions, then close."""
        self.closing = True
        if self.nc.is_closed:
            return
        try:
            await self.nc.drain()
        except nats.errors.Error as exc:
            log.warning("nats drain failed, closing", extra={"error": repr(exc)})
            await self.nc.close()
