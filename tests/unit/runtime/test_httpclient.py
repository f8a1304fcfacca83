"""The HTTP/1.1 client against small servers that answer exactly as each test needs:
kept connections, chunked lines, a server that closes or stalls, a CONNECT proxy to TLS."""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from neuron_dra_cli.stack.pki import Pki
from neuron_dra_common.httpclient import HttpClient, HttpError

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class _Server:
    """Runs ``handler`` for every connection and counts the connections."""

    def __init__(self, handler: Handler, *, tls: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        self.tls = tls
        self.connections = 0
        self.server: asyncio.Server | None = None
        self.port = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.transport.abort()

    async def __aenter__(self) -> _Server:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()


async def _request_head(reader: asyncio.StreamReader) -> bytes:
    return await reader.readuntil(b"\r\n\r\n")


def _answer(body: bytes, *, extra: str = "") -> bytes:
    head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    return head.encode() + body


async def _keep_answering(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        head = await _request_head(reader)
        path = head.split(b" ")[1]
        writer.write(_answer(path))
        await writer.drain()


@pytest.fixture
async def keeper() -> AsyncIterator[_Server]:
    async with _Server(_keep_answering) as served:
        yield served


async def _get(client: HttpClient, target: str) -> tuple[int, bytes]:
    response = await client.request("GET", target)
    async with response:
        return response.status, await response.read()


async def test_a_finished_connection_serves_the_next_request(keeper: _Server) -> None:
    client = HttpClient(f"http://127.0.0.1:{keeper.port}")
    assert await _get(client, "/one") == (200, b"/one")
    assert await _get(client, "/two?x=1") == (200, b"/two?x=1")
    assert keeper.connections == 1
    await client.close()


async def test_a_path_in_the_url_comes_before_every_target(keeper: _Server) -> None:
    # A kubeconfig's server can sit behind a path (a proxy in front of the apiserver), as can
    # Alertmanager behind a route prefix.
    client = HttpClient(f"http://127.0.0.1:{keeper.port}/k8s/clusters/c-1/")
    assert await _get(client, "/api/v1/nodes?limit=1") == (
        200,
        b"/k8s/clusters/c-1/api/v1/nodes?limit=1",
    )
    await client.close()


async def test_a_body_left_unread_drops_its_connection() -> None:
    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await _request_head(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(b"body")
            await writer.drain()

    async with _Server(slow) as served:
        client = HttpClient(f"http://127.0.0.1:{served.port}")
        response = await client.request("GET", "/unread")
        response.release()
        assert await _get(client, "/next") == (200, b"body")
        assert served.connections == 2
        assert await _get(client, "/again") == (200, b"body")
        assert served.connections == 2
        await client.close()


async def test_a_kept_connection_the_server_closed_is_replaced() -> None:
    async def once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request_head(reader)
        writer.write(_answer(b"ok"))
        await writer.drain()
        # Closing while the client keeps the connection, as a server's idle timeout does.

    async with _Server(once) as served:
        client = HttpClient(f"http://127.0.0.1:{served.port}")
        assert await _get(client, "/") == (200, b"ok")
        await asyncio.sleep(0.05)
        assert await _get(client, "/") == (200, b"ok")
        assert served.connections == 2
        await client.close()


async def test_chunked_lines_come_whole_across_chunks() -> None:
    async def stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request_head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for piece in (b'{"a":', b'1}\n{"b":2}\n{"c"', b":3}\n", b'{"d":4}'):
            writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await _request_head(reader)  # the connection is kept for another request

    async with _Server(stream) as served:
        client = HttpClient(f"http://127.0.0.1:{served.port}")
        response = await client.request("GET", "/watch")
        async with response:
            lines = [line async for line in response.lines()]
        assert lines == [b'{"a":1}\n', b'{"b":2}\n', b'{"c":3}\n', b'{"d":4}']
        await client.close()


async def test_an_answer_cut_short_is_an_os_error() -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request_head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly part")
        await writer.drain()

    async with _Server(cut) as served:
        client = HttpClient(f"http://127.0.0.1:{served.port}")
        response = await client.request("GET", "/")
        with pytest.raises(HttpError, match="closed the connection"):
            async with response:
                await response.read()
        await client.close()


async def test_an_answer_that_is_not_http_is_an_os_error() -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request_head(reader)
        writer.write(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(1)

    async with _Server(garbage) as served:
        client = HttpClient(f"http://127.0.0.1:{served.port}")
        with pytest.raises(HttpError, match="malformed"):
            await client.request("GET", "/")
        await client.close()


async def test_a_silent_server_times_out() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request_head(reader)
        await asyncio.sleep(5)

    async with _Server(silent) as served:
        client = HttpClient(f"http://127.0.0.1:{served.port}")
        with pytest.raises(TimeoutError):
            await client.request("GET", "/", read_timeout=0.1)
        await client.close()


async def test_the_pool_bounds_requests_in_flight(keeper: _Server) -> None:
    client = HttpClient(f"http://127.0.0.1:{keeper.port}", pool_size=1)
    first = await client.request("GET", "/first")
    second = asyncio.create_task(_get(client, "/second"))
    await asyncio.sleep(0.05)
    assert not second.done()
    async with first:
        assert await first.read() == b"/first"
    assert await second == (200, b"/second")
    assert keeper.connections == 1
    await client.close()


async def test_a_body_is_sent_with_its_length() -> None:
    seen: list[bytes] = []

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await _request_head(reader)
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        seen.append(head)
        writer.write(_answer(await reader.readexactly(length)))
        await writer.drain()
        await _request_head(reader)

    async with _Server(echo) as served:
        client = HttpClient(f"http://127.0.0.1:{served.port}")
        response = await client.request(
            "POST", "/api", headers={"Content-Type": "application/json"}, body=b'{"x": 1}'
        )
        async with response:
            assert await response.read() == b'{"x": 1}'
        assert seen[0].startswith(b"POST /api HTTP/1.1\r\nHost: 127.0.0.1:")
        assert b"Content-Type: application/json\r\n" in seen[0]
        await client.close()


@pytest.mark.parametrize("proxy_scheme", ["http", "https"])
async def test_an_https_server_behind_a_connect_proxy(tmp_path: Path, proxy_scheme: str) -> None:
    pki = Pki(tmp_path / "pki")
    cert = pki.apiserver()
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert.cert, cert.key)
    asked: list[bytes] = []

    async with _Server(_keep_answering, tls=tls) as origin:

        async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            asked.append(await _request_head(reader))
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", origin.port)
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")

            async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()

            try:
                await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
            finally:
                up_writer.transport.abort()

        # An https:// proxy speaks TLS itself: the tunnel to the server is TLS within TLS.
        proxy_tls = tls if proxy_scheme == "https" else None
        async with _Server(proxy, tls=proxy_tls) as relay:
            client_tls = ssl.create_default_context(cafile=str(tmp_path / "pki" / "ca.crt"))
            auth = "Basic " + base64.b64encode(b"u:p").decode()
            client = HttpClient(
                f"https://127.0.0.1:{origin.port}",
                ssl=client_tls,
                proxy=f"{proxy_scheme}://127.0.0.1:{relay.port}",
                proxy_headers={"Proxy-Authorization": auth},
                proxy_ssl=client_tls,
            )
            assert await _get(client, "/through") == (200, b"/through")
            assert await _get(client, "/again") == (200, b"/again")
            await client.close()
    assert len(asked) == 1
    assert asked[0].startswith(f"CONNECT 127.0.0.1:{origin.port} HTTP/1.1\r\n".encode())
    assert f"Proxy-Authorization: {auth}\r\n".encode() in asked[0]


async def test_a_proxy_that_refuses_connect_is_named(tmp_path: Path) -> None:
    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request_head(reader)
        writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()

    async with _Server(refuse) as relay:
        client = HttpClient("https://127.0.0.1:1", proxy=f"http://127.0.0.1:{relay.port}")
        with pytest.raises(HttpError, match="407 Proxy Authentication Required"):
            await client.request("GET", "/")
        await client.close()


async def test_a_plain_server_behind_a_proxy_gets_the_absolute_form() -> None:
    async def absolute(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await _request_head(reader)
        writer.write(_answer(head.split(b" ")[1]))
        await writer.drain()

    async with _Server(absolute) as relay:
        client = HttpClient("http://alertmanager:9093/am", proxy=f"http://127.0.0.1:{relay.port}")
        assert await _get(client, "/api/v2/alerts") == (
            200,
            b"http://alertmanager:9093/am/api/v2/alerts",
        )
        await client.close()


def test_only_http_urls_are_taken() -> None:
    with pytest.raises(ValueError, match="not an http or https URL"):
        HttpClient("unix:///run/socket")
    with pytest.raises(ValueError, match="only http:// and https:// proxies are supported"):
        HttpClient("https://10.0.0.1:6443", proxy="socks5://proxy.local:1080")
