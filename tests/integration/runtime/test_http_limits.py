"""A service's HTTP server, in a real process, holds to its limits against clients that
misbehave: large bodies are refused unread (and the process stays small), slow heads and idle
connections are cut off on time, connections past the cap are refused, and nothing listens
on every interface unless told to."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from neuron_dra_cli.stack.process import free_port
from neuron_dra_scheduler_extender.verbs import ARGS_MAX_BODY, BIND_MAX_BODY

ROOT = Path(__file__).resolve().parents[3]
MIB = 2**20
BIG = 10 * MIB

#: The limits the module's server runs with: short, so that a test waits seconds, not minutes.
HEADER_TIMEOUT = 2.0
IDLE_TIMEOUT = 4.0
REQUEST_TIMEOUT = 2.0
MAX_CONNECTIONS = 8


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int

    def rss(self) -> int:
        """The process's resident memory, in bytes."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")


def _start(env: Mapping[str, str]) -> Server:
    port = free_port()
    full = {**os.environ, "NEURON_DRA_HTTP_PORT": str(port), "NEURON_DRA_LOG_LEVEL": "warning"}
    full.pop("NEURON_DRA_HTTP_HOST", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.runtime.http_service"],
        cwd=ROOT,
        env={**full, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    server = Server(proc, port)
    deadline = time.monotonic() + 30
    while True:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        try:
            status, _ = asyncio.run(_get_once(port, "/readyz"))
            if status == 200:
                return server
        except OSError:
            pass
        assert time.monotonic() < deadline, "the server never became ready"
        time.sleep(0.1)


def _stop(server: Server) -> None:
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(10)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()
    if server.proc.stderr is not None:
        server.proc.stderr.close()


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    started = _start(
        {
            "NEURON_DRA_HTTP_HEADER_TIMEOUT": str(HEADER_TIMEOUT),
            "NEURON_DRA_HTTP_IDLE_TIMEOUT": str(IDLE_TIMEOUT),
            "NEURON_DRA_HTTP_REQUEST_TIMEOUT": str(REQUEST_TIMEOUT),
            "NEURON_DRA_HTTP_MAX_CONNECTIONS": str(MAX_CONNECTIONS),
        }
    )
    try:
        yield started
    finally:
        _stop(started)


class Conn:
    """A raw client connection: every byte sent is the test's, every byte read is seen."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Conn:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def status(self, within: float = 5) -> tuple[int, dict[str, str], bytes]:
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), within)
        first, *lines = head.decode("latin-1").split("\r\n")[:-2]
        headers = {}
        for line in lines:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
        body = await asyncio.wait_for(
            self.reader.readexactly(int(headers.get("content-length", "0"))), within
        )
        return int(first.split(" ")[1]), headers, body

    async def closed_within(self, seconds: float) -> bool:
        """Whether the server ends the connection within ``seconds`` (anything it still
        sends is read and dropped)."""
        try:
            async with asyncio.timeout(seconds):
                while await self.reader.read(65536):
                    pass
        except TimeoutError:
            return False
        except ConnectionError:
            pass
        return True

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


async def _get_once(port: int, path: str) -> tuple[int, bytes]:
    conn = await Conn.open(port)
    try:
        conn.send(f"GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode())
        status, _, body = await conn.status()
        return status, body
    finally:
        await conn.close()


async def _send_big_body(conn: Conn, size: int) -> None:
    """Try to send ``size`` bytes of body; the server may stop reading and close first."""
    chunk = b"x" * MIB
    with contextlib.suppress(ConnectionError):
        for _ in range(size // MIB):
            conn.send(chunk)
            await asyncio.wait_for(conn.writer.drain(), 10)


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics"])
async def test_a_large_post_to_a_probe_or_metrics_is_refused_unread(
    server: Server, path: str
) -> None:
    before = server.rss()
    conn = await Conn.open(server.port)
    try:
        # Answered on the head alone: the server does not wait for (or read) the body.
        conn.send(f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {BIG}\r\n\r\n".encode())
        status, headers, _ = await conn.status(within=2)
        assert status == 405
        assert "POST" not in headers["allow"]
        await _send_big_body(conn, BIG)
        assert await conn.closed_within(5)
    finally:
        await conn.close()
    # A GET that announces a body is refused the same way.
    conn = await Conn.open(server.port)
    try:
        conn.send(f"GET {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {BIG}\r\n\r\n".encode())
        status, _, _ = await conn.status(within=2)
        assert status == 413
        await _send_big_body(conn, BIG)
        assert await conn.closed_within(5)
    finally:
        await conn.close()
    assert server.rss() - before < 6 * MIB, (before, server.rss())
    assert (await _get_once(server.port, path))[0] == 200


async def test_a_post_past_an_extender_verbs_limit_gets_413(server: Server) -> None:
    before = server.rss()
    for path, limit in (("/filter", ARGS_MAX_BODY), ("/bind", BIND_MAX_BODY)):
        assert limit < BIG
        conn = await Conn.open(server.port)
        try:
            conn.send(f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {BIG}\r\n\r\n".encode())
            status, headers, _ = await conn.status(within=2)
            assert status == 413
            assert headers["connection"] == "close"
            await _send_big_body(conn, BIG)
            assert await conn.closed_within(5)
        finally:
            await conn.close()
    # Without a length (chunked): refused once it runs past the limit, not read to its end.
    conn = await Conn.open(server.port)
    try:
        conn.send(b"POST /prioritize HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"%x\r\n%s\r\n" % (MIB, b"x" * MIB)
        with contextlib.suppress(ConnectionError):
            for _ in range(BIG // MIB):
                conn.send(chunk)
                await asyncio.wait_for(conn.writer.drain(), 10)
        status, _, _ = await conn.status()
        assert status == 413
    finally:
        await conn.close()
    assert server.rss() - before < ARGS_MAX_BODY + 4 * MIB, (before, server.rss())
    # Within its limit, a verb reads its whole body.
    conn = await Conn.open(server.port)
    try:
        body = b"x" * (2 * MIB)
        conn.send(b"POST /filter HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % len(body))
        conn.send(body)
        status, _, answer = await conn.status()
        assert (status, json.loads(answer)) == (200, {"read": len(body)})
    finally:
        await conn.close()


async def test_a_head_trickled_a_byte_a_second_is_cut_off(server: Server) -> None:
    conn = await Conn.open(server.port)
    loop = asyncio.get_running_loop()
    started = loop.time()
    cut = False
    try:
        for byte in b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Slow: " + b"a" * 30:
            conn.send(bytes([byte]))
            with contextlib.suppress(ConnectionError):
                await conn.writer.drain()
            if await conn.closed_within(1.0):
                cut = True
                break
    finally:
        await conn.close()
    took = loop.time() - started
    assert cut, "the server kept waiting for the head"
    assert HEADER_TIMEOUT - 0.5 <= took <= HEADER_TIMEOUT + 2.5, took


async def test_a_body_trickled_past_the_request_timeout_is_answered_408(server: Server) -> None:
    conn = await Conn.open(server.port)
    loop = asyncio.get_running_loop()
    try:
        conn.send(b"POST /filter HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n{")
        started = loop.time()
        status, headers, _ = await conn.status(within=REQUEST_TIMEOUT + 3)
        assert status == 408
        assert headers["connection"] == "close"
        assert loop.time() - started < REQUEST_TIMEOUT + 1.5
    finally:
        await conn.close()


async def test_a_connection_past_the_cap_is_refused_until_one_closes(server: Server) -> None:
    held = [await Conn.open(server.port) for _ in range(MAX_CONNECTIONS)]
    try:
        # Each of them is served.
        for conn in held:
            conn.send(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
            assert (await conn.status())[0] == 200
        extra = await Conn.open(server.port)
        try:
            extra.send(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
            assert await extra.closed_within(2)
        finally:
            await extra.close()
        await held.pop().close()
        await asyncio.sleep(0.2)
        assert (await _get_once(server.port, "/healthz"))[0] == 200
    finally:
        for conn in held:
            await conn.close()


async def test_an_idle_connection_is_closed_on_time_though_it_sends_a_byte_now_and_then() -> None:
    # A head may take long here: only the idle timeout can end this connection.
    idle = 2.0
    server = await asyncio.to_thread(
        _start, {"NEURON_DRA_HTTP_IDLE_TIMEOUT": str(idle), "NEURON_DRA_HTTP_HEADER_TIMEOUT": "60"}
    )
    try:
        conn = await Conn.open(server.port)
        loop = asyncio.get_running_loop()
        try:
            conn.send(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
            assert (await conn.status())[0] == 200
            answered = loop.time()
            cut = False
            for byte in b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Slow: " + b"a" * 30:
                conn.send(bytes([byte]))
                with contextlib.suppress(ConnectionError):
                    await conn.writer.drain()
                if await conn.closed_within(0.5):
                    cut = True
                    break
            took = loop.time() - answered
        finally:
            await conn.close()
        assert cut, "the connection stayed open"
        assert idle - 0.5 <= took <= idle + 2.5, took
    finally:
        await asyncio.to_thread(_stop, server)


def test_by_default_nothing_listens_on_every_interface() -> None:
    server = _start({})
    try:
        listening = _listening_addresses(server.port)
        assert listening == {"127.0.0.1"}, listening
    finally:
        _stop(server)


def _listening_addresses(port: int) -> set[str]:
    """The local addresses of the sockets listening on ``port`` (IPv4 and IPv6)."""
    found = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        with contextlib.suppress(FileNotFoundError), open(table, encoding="ascii") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                address, hex_port = fields[1].split(":")
                if int(hex_port, 16) != port or fields[3] != "0A":  # 0A: LISTEN
                    continue
                raw = bytes.fromhex(address)
                if width == 8:
                    found.add(".".join(str(b) for b in reversed(raw)))
                else:
                    found.add(raw.hex())
    return found
