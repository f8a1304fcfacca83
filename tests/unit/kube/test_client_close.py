"""A closed Kubernetes client holds no socket, even one whose TLS peer never answers again.

aiohttp (kubernetes-asyncio's transport) aborts the TLS connections it keeps when its session
closes, rather than waiting for a peer's reply to a polite close: an apiserver gone silent
cannot keep a socket open past the client's ``close``. (A call cancelled before its answer
came closes its connection politely; asyncio then aborts it after its SSL shutdown timeout,
30 s, if the peer never replies. aiohttp's connector option that would abort it sooner,
``enable_cleanup_closed``, is not reachable through kubernetes-asyncio's public API.)
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from neuron_dra_cli.stack.pki import Pki
from neuron_dra_common.kube import NODES, KubeClient, load_kubeconfig


class _SilentServer:
    """A TLS server that answers one request (keeping the connection) and then neither
    answers, reads nor closes: the peer of a close that is never acknowledged."""

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
            body = b'{"kind":"Node","metadata":{"name":"n1"}}'
            tls.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
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


async def test_a_kept_connection_to_a_silent_peer_is_gone_after_close(
    server: _SilentServer, tmp_path: Path
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {
                            "server": f"https://127.0.0.1:{server.port}",
                            "certificate-authority": str(tmp_path / "pki" / "ca.crt"),
                        },
                    }
                ],
                "contexts": [{"name": "x", "context": {"cluster": "c"}}],
                "current-context": "x",
            }
        )
    )
    client = KubeClient(await load_kubeconfig(kubeconfig))
    node = await client.get(NODES, "n1")
    assert node["metadata"]["name"] == "n1"
    assert server.asked.is_set()
    assert _sockets_to(server.port) == 1, "the connection is kept for the next call"
    await client.close()
    assert _sockets_to(server.port) == 0
