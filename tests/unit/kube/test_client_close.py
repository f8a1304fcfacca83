"""A closed Kubernetes client holds no socket, even one whose TLS peer never answered.

A call cancelled mid-response closes its connection; over TLS the close waits for the peer's
reply. An apiserver too busy to give it (or gone) must not keep that socket open past the
client's ``close``: once the event loop is gone nothing would ever close it.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from neuron_dra_cli.stack.pki import Pki
from neuron_dra_common.kube.client import KubeClient
from neuron_dra_common.kube.config import KubeConfig


class _SilentServer:
    """A TLS server that takes one request and then neither answers nor reads: the peer of
    a call that is cancelled mid-response and of a close that is never acknowledged."""

    def __init__(self, pki: Pki) -> None:
        cert = pki.apiserver()
        self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._tls.load_cert_chain(cert.cert, cert.key)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.asked = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        conn, _ = self._listener.accept()
        with self._tls.wrap_socket(conn, server_side=True) as tls:
            tls.recv(65536)
            self.asked.set()
            self._done.wait(30)

    def close(self) -> None:
        self._done.set()
        self._thread.join(10)
        self._listener.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[_SilentServer]:
    served = _SilentServer(Pki(tmp_path / "pki"))
    try:
        yield served
    finally:
        served.close()


def _sockets_to(port: int) -> int:
    """This process's open sockets connected to ``port`` on this host (from /proc)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                if int(fields[2].rsplit(":", 1)[1], 16) == port:
                    inodes.add(fields[9])
    held = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            held += 1
    return held


async def test_a_call_cancelled_mid_response_holds_no_socket_after_close(
    server: _SilentServer, tmp_path: Path
) -> None:
    client = KubeClient(
        KubeConfig(
            server=f"https://127.0.0.1:{server.port}",
            source="test",
            ca_file=str(tmp_path / "pki" / "ca.crt"),
        )
    )
    call = asyncio.create_task(client.request("GET", "/api"))
    await asyncio.to_thread(server.asked.wait, 10)
    assert server.asked.is_set()
    assert _sockets_to(server.port) == 1
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await client.close()
    assert _sockets_to(server.port) == 0
