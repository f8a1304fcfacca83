"""The probe server answers /healthz, /readyz and /metrics from the checks it was given, and
the JSON endpoints a service adds, each within its limits; checked on raw connections so that
every byte it sends is seen. (HTTP itself is aiohttp's; what is ours is tested here.)"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from neuron_dra_common.runtime import HealthServer, HttpLimits
from neuron_dra_common.runtime import http as http_module
from neuron_dra_common.runtime.process import limits_of
from neuron_dra_common.settings import ServiceSettings, SettingsError, load


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> object:
        return json.loads(self.body)


class Connection:
    """One client connection, writing raw requests and reading the answers off it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Connection:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    def send(self, raw: bytes) -> None:
        self.writer.write(raw)

    async def request(
        self, method: str, target: str, body: bytes = b"", headers: str = ""
    ) -> Answer:
        length = f"Content-Length: {len(body)}\r\n" if body or method == "POST" else ""
        head = f"{method} {target} HTTP/1.1\r\nHost: test\r\n{length}{headers}\r\n"
        self.send(head.encode() + body)
        return await self.answer(head_only=method == "HEAD")

    async def answer(self, *, head_only: bool = False) -> Answer:
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 5)
        status_line, *lines = head.decode("latin-1").split("\r\n")[:-2]
        version, status, _ = status_line.split(" ", 2)
        assert version in ("HTTP/1.0", "HTTP/1.1")
        headers = {}
        for line in lines:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
        length = int(headers["content-length"])
        body = b"" if head_only else await self.reader.readexactly(length)
        return Answer(int(status), headers, body)

    async def closed(self) -> bool:
        """Whether the server closed the connection (within a few seconds)."""
        try:
            return await asyncio.wait_for(self.reader.read(), 5) == b""
        except ConnectionResetError:
            return True

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


async def echo(body: bytes | bytearray) -> tuple[int, bytes]:
    return 200, b'{"got": %d}' % len(body)


async def fail(body: bytes | bytearray) -> tuple[int, bytes]:
    raise RuntimeError("the endpoint is broken")


@pytest.fixture
async def server() -> AsyncIterator[HealthServer]:
    server = HealthServer(host="127.0.0.1", port=0)
    server.add_liveness("loop", lambda: True)
    server.add_json_post("/echo", echo, max_body=1024)
    server.add_json_post("/fail", fail)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def conn(server: HealthServer) -> AsyncIterator[Connection]:
    conn = await Connection.open(server.port)
    try:
        yield conn
    finally:
        await conn.close()


async def test_probes_follow_their_checks() -> None:
    ready: dict[str, bool] = {"nats": False, "apiserver": False}
    server = HealthServer(host="127.0.0.1", port=0)
    server.add_liveness("loop", lambda: True)
    server.add_readiness("nats", lambda: ready["nats"])
    server.add_readiness("apiserver", lambda: ready["apiserver"])
    await server.start()
    conn = await Connection.open(server.port)
    try:
        answer = await conn.request("GET", "/readyz")
        assert answer.status == 503
        assert answer.headers["content-type"] == "application/json"
        assert answer.json() == {"status": "failing", "failing": ["apiserver", "nats"]}
        ready["apiserver"] = True
        answer = await conn.request("GET", "/readyz")
        assert answer.json() == {"status": "failing", "failing": ["nats"]}
        ready["nats"] = True
        answer = await conn.request("GET", "/readyz")
        assert (answer.status, answer.json()) == (200, {"status": "ok"})
        answer = await conn.request("GET", "/healthz")
        assert (answer.status, answer.json()) == (200, {"status": "ok"})
        answer = await conn.request("GET", "/metrics")
        assert answer.status == 200
        assert answer.headers["content-type"].startswith("text/plain")
        assert b"python_info" in answer.body
    finally:
        await conn.close()
        await server.stop()


async def test_a_service_adds_its_own_json_endpoints_beside_the_probes() -> None:
    server = HealthServer(host="127.0.0.1", port=0)
    server.add_json_post("/filter", echo, max_body=16 * 2**20)
    await server.start()
    conn = await Connection.open(server.port)
    try:
        # A scheduler without a node cache sends every candidate Node: megabytes.
        big = b"x" * (8 * 2**20)
        answer = await conn.request("POST", "/filter", big)
        assert answer.status == 200
        assert answer.headers["content-type"] == "application/json"
        assert answer.json() == {"got": len(big)}
    finally:
        await conn.close()
        await server.stop()
    with pytest.raises(ValueError, match="/healthz is served twice"):
        server.add_json_post("/healthz", echo)
    with pytest.raises(ValueError, match="/filter is served twice"):
        server.add_json_post("/filter", echo)


async def test_a_connection_is_kept_alive_between_requests(conn: Connection) -> None:
    first = await conn.request("POST", "/echo", b"{}")
    second = await conn.request("GET", "/healthz")
    assert (first.status, first.json()) == (200, {"got": 2})
    assert second.status == 200
    assert "connection" not in first.headers
    assert "connection" not in second.headers


async def test_requests_sent_ahead_are_answered_in_order(conn: Connection) -> None:
    conn.send(
        b"POST /echo HTTP/1.1\r\nHost: test\r\nContent-Length: 3\r\n\r\n{1}"
        b"GET /nowhere HTTP/1.1\r\nHost: test\r\n\r\n"
        b"POST /echo HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"2\r\n{}\r\n3\r\n[1]\r\n0\r\n\r\n"
    )
    answers = [await conn.answer() for _ in range(3)]
    assert [a.status for a in answers] == [200, 404, 200]
    assert answers[0].json() == {"got": 3}
    assert answers[2].json() == {"got": 5}


async def test_an_unknown_path_is_404_and_a_wrong_method_405(conn: Connection) -> None:
    answer = await conn.request("GET", "/nowhere")
    assert answer.status == 404
    assert answer.body == b"404: Not Found"
    answer = await conn.request("GET", "/echo")
    assert answer.status == 405
    assert answer.headers["allow"] == "POST"
    answer = await conn.request("POST", "/healthz", b"{}")
    assert answer.status == 405
    assert set(answer.headers["allow"].replace(" ", "").split(",")) == {"GET", "HEAD"}
    # Neither closes the connection.
    assert (await conn.request("GET", "/healthz")).status == 200


async def test_head_answers_the_length_without_the_body(conn: Connection) -> None:
    answer = await conn.request("HEAD", "/healthz")
    assert answer.status == 200
    assert int(answer.headers["content-length"]) == len(b'{"status": "ok"}')
    assert (await conn.request("GET", "/healthz")).json() == {"status": "ok"}


async def test_a_query_string_does_not_change_the_route(conn: Connection) -> None:
    assert (await conn.request("GET", "/healthz?verbose=1")).status == 200
    answer = await conn.request("POST", "/echo?timeout=5s", b"[1]")
    assert (answer.status, answer.json()) == (200, {"got": 3})


async def test_a_body_past_the_limit_is_refused_with_413(server: HealthServer) -> None:
    # Announced: refused on its headers, before any of the body is read.
    conn = await Connection.open(server.port)
    conn.send(b"POST /echo HTTP/1.1\r\nHost: test\r\nContent-Length: 1025\r\n\r\n")
    answer = await conn.answer()
    assert answer.status == 413
    assert answer.headers["connection"] == "close"
    assert await conn.closed()
    await conn.close()
    # Chunked: refused once it runs past the limit.
    conn = await Connection.open(server.port)
    chunk = b"x" * 600
    conn.send(
        b"POST /echo HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"258\r\n%s\r\n258\r\n%s\r\n" % (chunk, chunk)
    )
    assert (await conn.answer()).status == 413
    assert await conn.closed()
    await conn.close()
    # At the limit: read whole.
    conn = await Connection.open(server.port)
    answer = await conn.request("POST", "/echo", b"x" * 1024)
    assert (answer.status, answer.json()) == (200, {"got": 1024})
    await conn.close()


async def test_a_client_expecting_100_continue_is_told_to_send_its_body(
    conn: Connection,
) -> None:
    conn.send(
        b"POST /echo HTTP/1.1\r\nHost: test\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n"
    )
    interim = await asyncio.wait_for(conn.reader.readuntil(b"\r\n\r\n"), 5)
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    conn.send(b"{}")
    answer = await conn.answer()
    assert (answer.status, answer.json()) == (200, {"got": 2})


async def test_a_malformed_request_is_answered_400_and_closed(conn: Connection) -> None:
    conn.send(b"GET /healthz HTTP/1.1\r\nHost test\r\n\r\n")
    answer = await conn.answer()
    assert answer.status == 400
    assert await conn.closed()


async def test_a_head_past_its_limit_is_refused(conn: Connection) -> None:
    conn.send(b"GET /healthz HTTP/1.1\r\nHost: test\r\nX-Padding: " + b"x" * 200_000)
    answer = await conn.answer()
    assert answer.status in (400, 431)
    assert await conn.closed()


async def test_an_endpoint_that_raises_answers_500_and_the_server_goes_on(
    conn: Connection, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger=http_module.__name__):
        answer = await conn.request("POST", "/fail", b"{}")
    assert answer.status == 500
    assert [r.getMessage() for r in caplog.records] == ["HTTP endpoint failed"]
    assert caplog.records[0].exc_info is not None
    assert (await conn.request("POST", "/echo", b"{}")).status == 200


async def test_stop_closes_idle_connections_at_once() -> None:
    server = HealthServer(host="127.0.0.1", port=0)
    await server.start()
    conn = await Connection.open(server.port)
    try:
        assert (await conn.request("GET", "/healthz")).status == 200
        await asyncio.wait_for(server.stop(), 1)
        assert await conn.closed()
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.0.0.1", server.port)
    finally:
        await conn.close()


async def test_stop_does_not_wait_forever_for_an_endpoint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(http_module, "_STOP_GRACE", 0.1)
    started = asyncio.Event()

    async def hang(body: bytes | bytearray) -> tuple[int, bytes]:
        started.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    server = HealthServer(host="127.0.0.1", port=0)
    server.add_json_post("/hang", hang)
    await server.start()
    conn = await Connection.open(server.port)
    try:
        conn.send(b"POST /hang HTTP/1.1\r\nHost: test\r\nContent-Length: 2\r\n\r\n{}")
        await asyncio.wait_for(started.wait(), 5)
        await asyncio.wait_for(server.stop(), 2)
        assert await conn.closed()
    finally:
        await conn.close()


def test_the_servers_address_and_limits_come_from_the_settings() -> None:
    settings = load(
        ServiceSettings,
        environ={
            "NEURON_DRA_HTTP_HEADER_TIMEOUT": "3",
            "NEURON_DRA_HTTP_IDLE_TIMEOUT": "20",
            "NEURON_DRA_HTTP_REQUEST_TIMEOUT": "7.5",
            "NEURON_DRA_HTTP_MAX_CONNECTIONS": "12",
        },
    )
    # Loopback unless the deployment says otherwise.
    assert settings.http_host == "127.0.0.1"
    assert limits_of(settings) == HttpLimits(
        header_timeout=3, idle_timeout=20, request_timeout=7.5, max_connections=12
    )
    with pytest.raises(SettingsError, match="NEURON_DRA_HTTP_HOST='every interface'"):
        load(ServiceSettings, environ={"NEURON_DRA_HTTP_HOST": "every interface"})
    with pytest.raises(SettingsError, match="NEURON_DRA_HTTP_MAX_CONNECTIONS='0': expected"):
        load(ServiceSettings, environ={"NEURON_DRA_HTTP_MAX_CONNECTIONS": "0"})
    with pytest.raises(SettingsError, match="NEURON_DRA_HTTP_HEADER_TIMEOUT='0': expected"):
        load(ServiceSettings, environ={"NEURON_DRA_HTTP_HEADER_TIMEOUT": "0"})
