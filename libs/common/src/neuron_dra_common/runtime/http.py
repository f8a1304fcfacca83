"""The one small HTTP server of a service: /metrics, /healthz, /readyz, and the JSON endpoints
a service adds beside them (the scheduler extender's verbs).

HTTP/1.1 on asyncio streams, each request parsed by llhttp (``httptools``): connections are
kept alive unless the client says otherwise (``Connection: close``, HTTP/1.0), requests sent
ahead are answered in order, every answer carries a Content-Length. A body is read whole, up
to ``max_body`` (413 past it); a request the parser refuses is answered 400, one whose head
runs past 64 KiB 431, and its connection closed. An endpoint that raises answers 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from httptools import HttpParserError, HttpParserUpgrade, HttpRequestParser

from neuron_dra_common.telemetry.registry import CONTENT_TYPE, REGISTRY, Registry

__all__ = ["HealthServer"]

log = logging.getLogger(__name__)

Check = Callable[[], bool]
#: A JSON endpoint: the request body in, the status and the JSON body out.
JsonHandler = Callable[[bytes], Awaitable[tuple[int, bytes]]]

#: The largest request body read. A scheduler extender without a node cache is sent every
#: candidate Node in full: megabytes on a large cluster.
_MAX_BODY = 128 * 2**20
_READ_SIZE = 65536
#: A request line and headers longer than this (give or take one read) are refused.
_MAX_HEAD = 65536
#: A connection waiting this long for its next request is closed.
_IDLE_TIMEOUT = 75.0
#: How long a refused request's remaining bytes are read and dropped before its connection
#: is closed: closing with unread bytes would reset it, and the client might lose the answer.
_LINGER = 2.0
#: How long :meth:`HealthServer.stop` lets an endpoint under way finish before cancelling it.
_STOP_GRACE = 2.0

_JSON = b"application/json"
_TEXT = b"text/plain; charset=utf-8"
_CLOSE = b"Connection: close\r\n"
_KEEP_ALIVE = b"Connection: keep-alive\r\n"
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_OK = json.dumps({"status": "ok"}).encode()
_STATUS_LINES = {s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode()) for s in HTTPStatus}


def _status_line(status: int) -> bytes:
    return _STATUS_LINES.get(status) or b"HTTP/1.1 %d \r\n" % status


def _error_body(status: int) -> bytes:
    """``404: Not Found``, as plain text."""
    return b"%d: %s" % (status, HTTPStatus(status).phrase.encode())


@dataclass(slots=True)
class _Route:
    method: bytes
    content_type: bytes
    handler: JsonHandler
    #: The Allow header of a 405 on this path.
    allow: bytes


@dataclass(slots=True)
class _Request:
    method: bytes
    #: The request target without its query string.
    path: bytes
    body: bytes
    keep_alive: bool
    #: The Connection header the answer carries (none for HTTP/1.1 keep-alive).
    connection: bytes


class _Refused(Exception):
    """Raised in a parser callback to stop parsing a request the server will not read."""


class _Requests:
    """The parser's callbacks for one connection: the requests read off it, in order, and
    the one under way."""

    def __init__(self, max_body: int) -> None:
        self.parser = HttpRequestParser(self)
        self.max_body = max_body
        self.done: list[_Request] = []
        #: The status a request was refused with (413), 0 when the parser refused it.
        self.refused = 0
        #: The request under way asked for ``100 Continue`` before it sends its body.
        self.expecting = False
        self.in_head = False
        self.head_size = 0
        self._target = b""
        self._chunks: list[bytes] = []
        self._size = 0
        self._keep_alive = True
        self._connection = b""

    def on_message_begin(self) -> None:
        self.in_head, self.head_size = True, 0
        self._target, self._chunks, self._size = b"", [], 0

    def on_url(self, url: bytes) -> None:
        self._target += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-length":
            if int(value) > self.max_body:
                self._refuse(413)
        elif name == b"expect" and value.lower() == b"100-continue":
            self.expecting = True

    def on_headers_complete(self) -> None:
        self.in_head = False
        # An Upgrade is not taken: the request is answered, then the connection closed.
        self._keep_alive = self.parser.should_keep_alive() and not self.parser.should_upgrade()
        if not self._keep_alive:
            self._connection = _CLOSE
        elif self.parser.get_http_version() == "1.0":
            self._connection = _KEEP_ALIVE
        else:
            self._connection = b""

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size > self.max_body:
            self._refuse(413)
        self._chunks.append(body)

    def on_message_complete(self) -> None:
        self.expecting = False
        target = self._target
        cut = target.find(b"?")
        self.done.append(
            _Request(
                method=self.parser.get_method(),
                path=target if cut < 0 else target[:cut],
                body=b"".join(self._chunks),
                keep_alive=self._keep_alive,
                connection=self._connection,
            )
        )
        self._chunks = []

    def head_too_long(self, read: int) -> bool:
        """Whether the request under way is still in its head after ``read`` more bytes,
        past the most a head may take."""
        if not self.in_head:
            return False
        self.head_size += read
        return self.head_size > _MAX_HEAD

    def _refuse(self, status: int) -> None:
        self.refused = status
        raise _Refused


def _respond(
    writer: asyncio.StreamWriter,
    status: int,
    content_type: bytes,
    body: bytes,
    headers: bytes,
    *,
    head_only: bool = False,
) -> None:
    head = b"%sContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n" % (
        _status_line(status),
        content_type,
        len(body),
        headers,
    )
    if head_only:
        writer.write(head)
    else:
        writer.writelines((head, body))


async def _linger(reader: asyncio.StreamReader) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(_LINGER):
            while await reader.read(_READ_SIZE):
                pass


class HealthServer:
    """Serves Prometheus metrics and the kubelet's probes.

    ``/healthz`` answers 200 while every liveness check passes (the process is not wedged);
    ``/readyz`` answers 200 once every readiness check passes, 503 with the failing names
    otherwise.
    """

    def __init__(
        self,
        *,
        host: str,
        port: int,
        registry: Registry = REGISTRY,
        max_body: int = _MAX_BODY,
    ) -> None:
        self._host, self._port = host, port
        self._registry = registry
        self._max_body = max_body
        self._live: dict[str, Check] = {}
        self._ready: dict[str, Check] = {}
        self._posts: dict[str, JsonHandler] = {}
        self._routes: dict[bytes, _Route] = {}
        self._server: asyncio.Server | None = None
        self._open: dict[asyncio.Task[Any], asyncio.StreamWriter] = {}
        self.port = port

    def add_liveness(self, name: str, check: Check) -> None:
        self._live[name] = check

    def add_readiness(self, name: str, check: Check) -> None:
        self._ready[name] = check

    def add_json_post(self, path: str, handler: JsonHandler) -> None:
        """Serve ``POST path`` with ``handler`` (a service's own API beside the probes, such
        as the scheduler extender's verbs); add before :meth:`start`."""
        if path in self._posts or path in ("/metrics", "/healthz", "/readyz"):
            raise ValueError(f"HTTP server: {path} is served twice")
        self._posts[path] = handler

    @staticmethod
    def _verdict(checks: dict[str, Check]) -> tuple[int, bytes]:
        failing = sorted(name for name, check in checks.items() if not check())
        if failing:
            return 503, json.dumps({"status": "failing", "failing": failing}).encode()
        return 200, _OK

    async def _metrics(self, _: bytes) -> tuple[int, bytes]:
        return 200, self._registry.expose()

    async def _healthz(self, _: bytes) -> tuple[int, bytes]:
        return self._verdict(self._live)

    async def _readyz(self, _: bytes) -> tuple[int, bytes]:
        return self._verdict(self._ready)

    async def start(self) -> None:
        get = b"Allow: GET, HEAD\r\n"
        self._routes = {
            b"/metrics": _Route(b"GET", CONTENT_TYPE.encode(), self._metrics, get),
            b"/healthz": _Route(b"GET", _JSON, self._healthz, get),
            b"/readyz": _Route(b"GET", _JSON, self._readyz, get),
        }
        for path, handler in self._posts.items():
            self._routes[path.encode()] = _Route(b"POST", _JSON, handler, b"Allow: POST\r\n")
        self._server = await asyncio.start_server(self._serve, self._host, self._port)
        # With port 0 the OS picked one; report the real port.
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop listening and close every connection, idle or not; an endpoint under way
        has a moment to finish (its answer is lost), then is cancelled."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for writer in self._open.values():
            writer.transport.abort()
        if self._open:
            _, late = await asyncio.wait(list(self._open), timeout=_STOP_GRACE)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late)
        await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is None or self._server is None:  # accepted as the server stopped
            writer.transport.abort()
            return
        self._open[task] = writer
        requests = _Requests(self._max_body)
        loop = asyncio.get_running_loop()
        try:
            while True:
                idle = loop.call_later(_IDLE_TIMEOUT, writer.transport.abort)
                try:
                    data = await reader.read(_READ_SIZE)
                finally:
                    idle.cancel()
                if not data:
                    return
                refused, last = 0, False
                try:
                    requests.parser.feed_data(data)
                except HttpParserUpgrade:  # what follows is not HTTP/1.1: answer, then close
                    last = True
                except HttpParserError:
                    refused, last = requests.refused or 400, True
                else:
                    if requests.head_too_long(len(data)):
                        refused, last = 431, True
                for request in requests.done:
                    await self._answer(request, writer)
                    if not request.keep_alive:
                        return
                requests.done.clear()
                if refused:
                    _respond(writer, refused, _TEXT, _error_body(refused), _CLOSE)
                    writer.write_eof()
                    await _linger(reader)
                if last:
                    return
                if requests.expecting:
                    writer.write(_CONTINUE)
                    requests.expecting = False
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass  # the client went away, or the server is stopping
        except Exception:
            log.exception("HTTP connection failed")
        finally:
            del self._open[task]
            writer.close()

    async def _answer(self, request: _Request, writer: asyncio.StreamWriter) -> None:
        headers = request.connection
        route = self._routes.get(request.path)
        if route is None:
            status, content_type, body = 404, _TEXT, _error_body(404)
        elif request.method == route.method or (
            request.method == b"HEAD" and route.method == b"GET"
        ):
            content_type = route.content_type
            try:
                status, body = await route.handler(request.body)
            except Exception:
                log.exception("HTTP endpoint failed", extra={"path": request.path.decode()})
                status, content_type, body = 500, _TEXT, _error_body(500)
        else:
            status, content_type, body = 405, _TEXT, _error_body(405)
            headers += route.allow
        _respond(writer, status, content_type, body, headers, head_only=request.method == b"HEAD")
