"""An HTTP/1.1 client of one server (the Kubernetes API, Alertmanager), on asyncio streams.

A service talks to one or two servers, with JSON bodies and, for watches, responses that
never end. That needs little of HTTP: keep-alive connections, TLS (with a client
certificate, a server name of its own), a proxy (``http://`` or ``https://``) reached with
``CONNECT``, ``Content-Length``
and chunked bodies, and timeouts. ``httptools`` (the llhttp parser) reads the responses;
everything else is here, so no process carries a general-purpose HTTP stack (and nats-py,
which imports aiohttp whenever it is installed, finds none).

- At most ``pool_size`` requests are in flight; finished connections are kept for the next
  request. A kept connection the server closed meanwhile is replaced once, transparently,
  when it fails before any byte of the answer came back.
- A response abandoned before its end (a call cancelled, a watch stopped) drops its
  connection with ``abort``: a polite TLS close would wait for the server's reply, and on
  Python before 3.12.8 could hold the socket after the event loop is gone.
- No failure to get an answer escapes as anything but :class:`OSError` (``HttpError`` for a
  connection that ended early or a malformed answer) or :class:`TimeoutError`.

Example::

    client = HttpClient("https://10.0.0.1:6443", ssl=context)
    response = await client.request("GET", "/version", headers={"Accept": "application/json"})
    body = await response.read()
    await client.close()
"""

from __future__ import annotations

import asyncio
import ssl as ssl_module
from collections.abc import AsyncIterator, Mapping
from types import TracebackType
from urllib.parse import urlsplit

import httptools

from neuron_dra_common.errors import SetupError

__all__ = ["HttpClient", "HttpError", "Response"]

_READ_SIZE = 1 << 20
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


class HttpError(OSError):
    """No usable answer: the connection ended early, or the answer was not HTTP."""


def _host_port(url: str) -> tuple[str, int, str]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url}: not an http or https URL")
    default = 443 if parts.scheme == "https" else 80
    port = parts.port or default
    host = parts.hostname
    shown = f"[{host}]" if ":" in host else host
    return host, port, shown if port == default else f"{shown}:{port}"


class _Connection:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def usable(self) -> bool:
        return not self.reader.at_eof() and not self.writer.transport.is_closing()

    def abort(self) -> None:
        self.writer.transport.abort()


class Response:
    """The answer to one request: ``status`` and ``headers`` (names in lower case) at once,
    the body through :meth:`read` or :meth:`lines`. Call :meth:`release` when done (the
    connection is kept if the body was read to its end, dropped otherwise)."""

    def __init__(self, client: HttpClient, connection: _Connection) -> None:
        self._client = client
        self._connection: _Connection | None = connection
        self._parser = httptools.HttpResponseParser(self)
        self._body = bytearray()
        self._headers_done = False
        self._complete = False
        self._keep_alive = False
        self._received = False
        self.status = 0
        self.headers: dict[str, str] = {}

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self._headers_done = True

    def on_body(self, body: bytes) -> None:
        self._body += body

    def on_message_complete(self) -> None:
        # Asked now: once the message is over, the parser forgets what its headers said.
        self._keep_alive = self._parser.should_keep_alive()
        self._complete = True

    async def _feed(self, read_timeout: float | None) -> None:
        connection = self._connection
        if connection is None:
            raise HttpError("response already released")
        if read_timeout is None:
            data = await connection.reader.read(_READ_SIZE)
        else:
            async with asyncio.timeout(read_timeout):
                data = await connection.reader.read(_READ_SIZE)
        if not data:
            if self._headers_done and _until_close(self.headers):
                self._complete = True  # a body delimited by the end of the connection
                return
            raise HttpError("the server closed the connection before its answer ended")
        self._received = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            raise HttpError(f"malformed HTTP answer: {exc}") from exc

    async def _head(self, read_timeout: float | None) -> None:
        while not self._headers_done:
            await self._feed(read_timeout)

    async def read(self, *, read_timeout: float | None = None) -> bytes:
        """The whole body (waiting at most ``read_timeout`` between two reads)."""
        while not self._complete:
            await self._feed(read_timeout)
        data = bytes(self._body)
        self._body.clear()
        return data

    async def lines(self, *, read_timeout: float | None = None) -> AsyncIterator[bytes]:
        """The body line by line (each with its ``\\n``; the last one may lack it)."""
        body = self._body
        while True:
            end = body.find(b"\n")
            if end >= 0:
                line = bytes(body[: end + 1])
                del body[: end + 1]
                yield line
            elif self._complete:
                if body:
                    yield bytes(body)
                    body.clear()
                return
            else:
                await self._feed(read_timeout)

    def release(self) -> None:
        """Done with the response: keep the connection if it can serve another request."""
        connection, self._connection = self._connection, None
        if connection is None:
            return
        if self._complete and self._keep_alive:
            self._client._keep(connection)
        else:
            connection.abort()
            self._client._free()

    def abort(self) -> None:
        """Drop the connection, whatever state the response is in."""
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.abort()
            self._client._free()

    async def __aenter__(self) -> Response:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.release()
        else:
            self.abort()


def _until_close(headers: Mapping[str, str]) -> bool:
    return "content-length" not in headers and "chunked" not in headers.get("transfer-encoding", "")


class HttpClient:
    """Requests to the server at ``url`` (``http://`` or ``https://``; a path in it is put
    before every request's target).

    ``ssl``: the context for an ``https`` server (default: the system's trust store);
    ``server_hostname``: the name to check its certificate against, when not the URL's host;
    ``proxy``: an ``http://`` or ``https://`` proxy (``CONNECT`` for an ``https`` server;
    TLS to the proxy, then TLS to the server through it, for an ``https://`` proxy) with
    ``proxy_headers`` (such as ``Proxy-Authorization``); ``proxy_ssl``: the context for an
    ``https://`` proxy (default: the system's trust store).
    """

    def __init__(
        self,
        url: str,
        *,
        ssl: ssl_module.SSLContext | None = None,
        server_hostname: str | None = None,
        proxy: str | None = None,
        proxy_headers: Mapping[str, str] | None = None,
        proxy_ssl: ssl_module.SSLContext | None = None,
        pool_size: int = 100,
    ) -> None:
        self.url = url.rstrip("/")
        self._host, self._port, self._host_header = _host_port(self.url)
        self._tls = self.url.startswith("https:")
        # A server behind a path (a proxy in front of the apiserver, Alertmanager with a
        # route prefix) gets every request under it.
        self._prefix = urlsplit(self.url).path
        self._origin = f"{'https' if self._tls else 'http'}://{self._host_header}"
        self._ssl = (ssl or ssl_module.create_default_context()) if self._tls else None
        self._server_hostname = server_hostname or self._host
        self._proxy: tuple[str, int] | None = None
        self._proxy_tls: ssl_module.SSLContext | None = None
        if proxy:
            try:
                self._proxy = _host_port(proxy)[:2]
            except ValueError:
                raise SetupError(
                    f"proxy {proxy}: only http:// and https:// proxies are supported"
                ) from None
            if proxy.startswith("https:"):
                self._proxy_tls = proxy_ssl or ssl_module.create_default_context()
        self._proxy_headers = dict(proxy_headers or {})
        self._slots = asyncio.Semaphore(pool_size)
        self._idle: list[_Connection] = []
        self._closed = False

    async def _open(self) -> _Connection:
        if self._proxy is None:
            reader, writer = await asyncio.open_connection(
                self._host,
                self._port,
                ssl=self._ssl,
                server_hostname=self._server_hostname if self._tls else None,
            )
            return _Connection(reader, writer)
        host, port = self._proxy
        reader, writer = await asyncio.open_connection(
            host,
            port,
            ssl=self._proxy_tls,
            server_hostname=host if self._proxy_tls is not None else None,
        )
        connection = _Connection(reader, writer)
        if not self._tls:
            return connection
        try:
            await self._tunnel(connection)
        except BaseException:
            connection.abort()
            raise
        return connection

    async def _tunnel(self, connection: _Connection) -> None:
        authority = f"{self._host}:{self._port}"
        head = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}"]
        head += [f"{name}: {value}" for name, value in self._proxy_headers.items()]
        connection.writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        try:
            answer = await connection.reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            raise HttpError(f"proxy {self._proxy}: no answer to CONNECT {authority}") from exc
        status_line = answer.split(b"\r\n", 1)[0].decode("latin-1")
        fields = status_line.split(" ", 2)
        if len(fields) < 2 or fields[1] != "200":
            raise HttpError(f"proxy refused CONNECT {authority}: {status_line}")
        assert self._ssl is not None
        await connection.writer.start_tls(self._ssl, server_hostname=self._server_hostname)

    def _take(self) -> _Connection | None:
        while self._idle:
            connection = self._idle.pop()
            if connection.usable():
                return connection
            connection.abort()
        return None

    def _keep(self, connection: _Connection) -> None:
        if self._closed or not connection.usable():
            connection.abort()
        else:
            self._idle.append(connection)
        self._slots.release()

    def _free(self) -> None:
        self._slots.release()

    def _encode_head(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes | None
    ) -> bytes:
        target = self._prefix + target
        if self._proxy is not None and not self._tls:
            target = self._origin + target  # absolute form, for the proxy
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self._host_header}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        if body is not None or method in _BODY_METHODS:
            lines.append(f"Content-Length: {len(body or b'')}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def request(
        self,
        method: str,
        target: str,
        *,
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
        read_timeout: float | None = None,
    ) -> Response:
        """Send one request (``target``: path and query) and return once the answer's
        status and headers are in. The caller reads the body and releases the response.

        ``read_timeout`` bounds each wait for the server; bound the whole exchange with
        ``asyncio.timeout`` around the call and the read.
        """
        if self._closed:
            raise HttpError(f"client of {self.url} is closed")
        data = self._encode_head(method, target, headers or {}, body)
        if body:
            data += body
        await self._slots.acquire()
        try:
            while True:
                connection = self._take()
                reused = connection is not None
                if connection is None:
                    connection = await self._open()
                response = Response(self, connection)
                try:
                    connection.writer.write(data)
                    await connection.writer.drain()
                    await response._head(read_timeout)
                except OSError:
                    connection.abort()
                    # A kept connection the server closed while it was idle: the request
                    # never reached it, so it goes on a fresh connection.
                    if reused and not response._received:
                        continue
                    raise
                except BaseException:
                    connection.abort()
                    raise
                return response
        except BaseException:
            self._slots.release()
            raise

    async def close(self) -> None:
        """Drop every kept connection; responses still open are dropped on release."""
        self._closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.abort()
        # A connection aborted here closes in a callback: let it run before the caller may
        # close its loop, so no socket outlives the client.
        for _ in range(3):
            await asyncio.sleep(0)
