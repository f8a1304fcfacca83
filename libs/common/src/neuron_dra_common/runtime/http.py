"""The one small HTTP server of a service: /metrics, /healthz, /readyz, and the JSON endpoints
a service adds beside them (the scheduler extender's verbs), on aiohttp.

Every input is bounded, so that no client can make a node agent run out of memory or file
descriptors (discovery has 256 MiB and shares the host's network):

- **bodies**: the probes and ``/metrics`` take none. A POST to them is answered 405, a GET
  that announces a body 413, both without reading it. A JSON endpoint reads at most its own
  ``max_body`` (413 past it, on the announced length before a byte is read, or as soon as a
  chunked body runs past it), into one buffer that the endpoint gets as it is. After a
  refusal the rest of the body is dropped as it comes, for at most two seconds (so that the
  client, still sending, reads the answer rather than a reset), and the connection closed;
- **time**: a request's head must arrive within ``header_timeout`` of its first byte, and the
  whole request (its body read, its answer made) within ``request_timeout`` (408 while the
  body was still coming, 503 if the endpoint was slow); a connection that has not sent a
  complete request head within ``idle_timeout`` of opening or of its last answer is closed,
  however many bytes it trickles meanwhile;
- **connections**: at most ``max_connections`` at a time; one more is closed as soon as it
  is accepted (its client sees the connection end, and tries again).

aiohttp parses and answers HTTP/1.1 (keep-alive, pipelining, chunked bodies, HEAD,
``Expect: 100-continue``, 404/405); what it has no setting for (the connection cap and the
header deadline) is a thin protocol around each of its connections, made through its public
low-level API (:attr:`aiohttp.web.AppRunner.server` is the protocol factory
``loop.create_server`` takes), which never reads the bytes it passes on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, cast

from aiohttp import web

from neuron_dra_common.telemetry import CONTENT_TYPE, REGISTRY, CollectorRegistry, expose

__all__ = ["DEFAULT_MAX_BODY", "HealthServer", "HttpLimits", "JsonHandler"]

log = logging.getLogger(__name__)

Check = Callable[[], bool]
#: A JSON endpoint: the request body in (read whole, at most the endpoint's ``max_body``),
#: the status and the JSON body out.
JsonHandler = Callable[[bytes | bytearray], Awaitable[tuple[int, bytes]]]
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: The largest body a JSON endpoint reads unless it says otherwise.
DEFAULT_MAX_BODY: Final = 64 * 1024
#: How long :meth:`HealthServer.stop` lets an endpoint under way finish before cancelling it.
_STOP_GRACE = 2.0
#: How long a refused request's remaining bytes are read and dropped before its connection is
#: closed: closing with unread bytes would reset it, and the client might lose the answer.
_LINGER: Final = 2.0
#: Refused connections are logged once per this many.
_REFUSALS_PER_LOG: Final = 100

_JSON: Final = "application/json"
_OK: Final = json.dumps({"status": "ok"}).encode()
_PROBES: Final = ("/metrics", "/healthz", "/readyz")


@dataclass(frozen=True, kw_only=True)
class HttpLimits:
    """The time and connection limits of one server (the body limits are per endpoint)."""

    #: Seconds from a request head's first byte to its end.
    header_timeout: float = 10.0
    #: Seconds a connection may go without a complete request head, from its start or its
    #: last answer.
    idle_timeout: float = 60.0
    #: Seconds from a request's head to its answer: reading the body and the endpoint's work.
    request_timeout: float = 30.0
    #: Connections served at once.
    max_connections: int = 100


class _Connection(asyncio.Protocol):
    """aiohttp's protocol for one connection, with the header deadline aiohttp has none of.

    aiohttp's own keep-alive timer closes a connection that has not completed a request head
    ``idle_timeout`` after it opened or after its last answer, whatever it trickles. A head
    started and then sent a byte a second is cut here, ``header_timeout`` after its first
    byte: a timer started when bytes arrive while no request is under way, stopped when
    aiohttp hands the request to the application (its head is complete then). Only the
    timing of the bytes is looked at; aiohttp alone parses them.

    Why a protocol around aiohttp's: aiohttp has no header-read timeout (its keep-alive timer
    is the idle limit, counted from a connection's start or last answer, not from a head's
    first byte), and nothing of a request reaches the application (a middleware, a signal)
    before its head is complete, too late to time it. The protocol needs only aiohttp's
    public protocol factory and the transport's public methods. It also admits or refuses
    each connection (the cap): asyncio's servers cannot pause accepting, so one past the cap
    is accepted and closed at once rather than left waiting unbounded in the backlog.
    """

    def __init__(self, inner: asyncio.Protocol, server: HealthServer) -> None:
        self._inner = inner
        self._server = server
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._in_request = False

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's is not a subclass of asyncio's, but is one).
        transport = cast(asyncio.Transport, base)
        if not self._server._admit(transport, self):
            transport.close()
            return
        self._transport = transport
        self._inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is None:  # refused: aiohttp never saw it
            return
        self._stop_timer()
        self._server._forget(self._transport)
        self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._in_request and self._timer is None and self._transport is not None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self._server.limits.header_timeout, self._too_slow)
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def request_started(self) -> None:
        self._in_request = True
        self._stop_timer()

    def request_ended(self) -> None:
        self._in_request = False

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _too_slow(self) -> None:
        self._timer = None
        if self._transport is not None:
            log.debug(
                "HTTP request head not complete in time: connection closed",
                extra={"peer": str(self._transport.get_extra_info("peername"))},
            )
            self._transport.abort()


class HealthServer:
    """Serves Prometheus metrics and the kubelet's probes, and a service's JSON endpoints.

    ``/healthz`` answers 200 while every liveness check passes (the process is not wedged);
    ``/readyz`` answers 200 once every readiness check passes, 503 with the failing names
    otherwise. Both answer JSON: ``{"status": "ok"}`` or
    ``{"status": "failing", "failing": [names]}``.

    >>> server = HealthServer(host="127.0.0.1", port=0)
    >>> server.add_json_post("/filter", handler, max_body=4 * 2**20)
    >>> await server.start()  # server.port is the port it listens on
    """

    def __init__(
        self,
        *,
        host: str,
        port: int,
        limits: HttpLimits | None = None,
        registry: CollectorRegistry = REGISTRY,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        """``tls``: serve HTTPS with this context (asyncio's TLS, as ``create_server`` takes
        it); its handshake must end within ``header_timeout``."""
        self._host, self._port = host, port
        self._tls = tls
        self.limits = limits or HttpLimits()
        self._registry = registry
        self._live: dict[str, Check] = {}
        self._ready: dict[str, Check] = {}
        self._posts: dict[str, tuple[JsonHandler, int]] = {}
        self._runner: web.AppRunner | None = None
        self._server: asyncio.Server | None = None
        self._open: dict[asyncio.Transport, _Connection] = {}
        self._refused = 0
        self.port = port

    def add_liveness(self, name: str, check: Check) -> None:
        self._live[name] = check

    def add_readiness(self, name: str, check: Check) -> None:
        self._ready[name] = check

    def add_json_post(
        self, path: str, handler: JsonHandler, *, max_body: int = DEFAULT_MAX_BODY
    ) -> None:
        """Serve ``POST path`` with ``handler`` (a service's own API beside the probes, such
        as the scheduler extender's verbs), reading at most ``max_body`` bytes of body; add
        before :meth:`start`."""
        if path in self._posts or path in _PROBES:
            raise ValueError(f"HTTP server: {path} is served twice")
        if max_body < 0:
            raise ValueError(f"HTTP server: {path}: max_body {max_body} is negative")
        self._posts[path] = (handler, max_body)

    @staticmethod
    def _verdict(checks: dict[str, Check]) -> web.Response:
        failing = sorted(name for name, check in checks.items() if not check())
        if failing:
            body = {"status": "failing", "failing": failing}
            return web.Response(status=503, body=json.dumps(body).encode(), content_type=_JSON)
        return web.Response(body=_OK, content_type=_JSON)

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=expose(self._registry), headers={"Content-Type": CONTENT_TYPE})

    async def _healthz(self, _: web.Request) -> web.Response:
        return self._verdict(self._live)

    async def _readyz(self, _: web.Request) -> web.Response:
        return self._verdict(self._ready)

    def _get(self, answer: Callable[[web.Request], Awaitable[web.Response]]) -> _Handler:
        async def handle(request: web.Request) -> web.StreamResponse:
            if request.body_exists:  # a GET that sends a body: refused, the body unread
                raise _too_large(request, 0)
            return await answer(request)

        return handle

    def _post(self, path: str, handler: JsonHandler, max_body: int) -> _Handler:
        async def handle(request: web.Request) -> web.StreamResponse:
            body = await _read_body(request, max_body)
            try:
                status, answer = await handler(body)
            except Exception:
                log.exception("HTTP endpoint failed", extra={"path": path})
                return web.Response(status=500, text="500: Internal Server Error")
            return web.Response(status=status, body=answer, content_type=_JSON)

        return handle

    @web.middleware
    async def _limits(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        transport = request.transport
        connection = self._open.get(transport) if transport is not None else None
        if connection is not None:
            connection.request_started()
        try:
            async with asyncio.timeout(self.limits.request_timeout):
                return await handler(request)
        except web.HTTPException as refusal:
            if request.body_exists and not request.content.is_eof():
                # Refused (404, 405, 413) with its body unread: the connection ends after the
                # answer, not after the rest of the body.
                refusal.force_close()
            raise
        except TimeoutError:
            if not request.content.is_eof():
                # The client is still sending its body: the rest is not waited for.
                error = web.HTTPRequestTimeout(text="408: the request body came too slowly")
                error.force_close()
                raise error from None
            log.warning("HTTP endpoint too slow", extra={"path": request.path})
            raise web.HTTPServiceUnavailable(text="503: the endpoint took too long") from None
        finally:
            if connection is not None:
                connection.request_ended()

    async def start(self) -> None:
        app = web.Application(middlewares=[self._limits])
        app.router.add_get("/metrics", self._get(self._metrics))
        app.router.add_get("/healthz", self._get(self._healthz))
        app.router.add_get("/readyz", self._get(self._readyz))
        for path, (handler, max_body) in self._posts.items():
            app.router.add_post(
                path, self._post(path, handler, max_body), expect_handler=_expect(max_body)
            )
        runner = web.AppRunner(
            app,
            # Probes every few seconds would be a log line each.
            access_log=None,
            keepalive_timeout=self.limits.idle_timeout,
            lingering_time=_LINGER,
            shutdown_timeout=_STOP_GRACE,
        )
        await runner.setup()
        factory = runner.server
        assert factory is not None
        self._runner = runner
        loop = asyncio.get_running_loop()
        try:
            self._server = await loop.create_server(
                lambda: _Connection(factory(), self),
                self._host,
                self._port,
                ssl=self._tls,
                ssl_handshake_timeout=self.limits.header_timeout if self._tls else None,
            )
        except BaseException:
            await runner.cleanup()
            self._runner = None
            raise
        # With port 0 the OS picked one; report the real port.
        self.port = int(self._server.sockets[0].getsockname()[1])

    def _admit(self, transport: asyncio.Transport, connection: _Connection) -> bool:
        if len(self._open) >= self.limits.max_connections or self._server is None:
            if self._refused % _REFUSALS_PER_LOG == 0:
                log.warning(
                    "HTTP connection refused: too many open",
                    extra={"open": len(self._open), "refused": self._refused + 1},
                )
            self._refused += 1
            return False
        self._open[transport] = connection
        return True

    def _forget(self, transport: asyncio.Transport) -> None:
        self._open.pop(transport, None)

    async def stop(self) -> None:
        """Stop listening and close every connection, idle or not; an endpoint under way
        has a moment to finish, then is cancelled."""
        server, self._server = self._server, None
        runner, self._runner = self._runner, None
        if server is not None:
            server.close()
        if runner is not None:
            await runner.cleanup()
        for transport in list(self._open):
            transport.abort()
        if server is not None:
            await server.wait_closed()


def _expect(max_body: int) -> Callable[[web.Request], Awaitable[web.StreamResponse | None]]:
    """Answer ``Expect: 100-continue``: 413 at once when the announced body is too large,
    so that the client never sends it."""

    async def expect(request: web.Request) -> web.StreamResponse | None:
        if (request.content_length or 0) > max_body:
            raise _too_large(request, max_body)
        if request.headers.get("Expect", "").lower() != "100-continue":
            raise web.HTTPExpectationFailed(text=f"Unknown Expect: {request.headers['Expect']}")
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        return None

    return expect


def _too_large(request: web.Request, max_body: int) -> web.HTTPException:
    """A 413 after which the connection is closed (the rest of the body is not read)."""
    error = web.HTTPRequestEntityTooLarge(
        max_size=max_body,
        actual_size=request.content_length or max_body + 1,
        text=f"413: the request body is larger than {max_body} bytes"
        if max_body
        else "413: this path takes no request body",
    )
    error.force_close()
    return error


async def _read_body(request: web.Request, max_body: int) -> bytearray:
    """The whole body, into one buffer: refused on its announced length before any of it is
    read, or as soon as it runs past ``max_body``."""
    declared = request.content_length
    if declared is not None and declared > max_body:
        raise _too_large(request, max_body)
    body = bytearray()
    async for chunk in request.content.iter_any():
        if len(body) + len(chunk) > max_body:
            raise _too_large(request, max_body)
        body += chunk
    return body
