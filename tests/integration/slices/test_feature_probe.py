"""Which features the cluster keeps is decided from the apiserver's answer, never from an
error: a publisher that starts while the apiserver fails waits for it, or refuses to start.

The apiserver is the stack's real one, reached through a small HTTP front that answers 503
(as an apiserver does while its storage is away) for as long as a test says, then passes
requests through; a front that never stops failing needs no apiserver behind it. The front
speaks plain HTTP/1.1 on asyncio streams: requests with a Content-Length, kept alive.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from urllib.parse import parse_qsl, unquote

import pytest
from neuron_dra_common.hardware.model import NeuronDevice, NodeHardware, UltraServerInfo
from neuron_dra_common.kube import RESOURCE_SLICES, ApiException, KubeClient, connect
from neuron_dra_slice_publisher.slices import NodeDeviceMode, build_pool
from neuron_dra_slice_publisher.wiring import FeatureUnknown, detect_mode, detect_taints

from tests.fixtures.nats import NatsServer, free_port
from tests.fixtures.stack import KubeStack

_UNAVAILABLE = {
    "kind": "Status",
    "apiVersion": "v1",
    "status": "Failure",
    "message": "etcdserver: request timed out",
    "reason": "ServiceUnavailable",
    "code": 503,
}


@dataclass
class FlakyApiserver:
    """Answers 503 to the first ``failures`` requests (all of them when negative), then
    forwards to the real apiserver; records what it was asked."""

    upstream: KubeClient | None = None
    failures: int = 0
    seen: list[tuple[str, str]] = field(default_factory=list)
    url: str = ""
    connections: set[asyncio.Task[None]] = field(default_factory=set)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One client connection: its requests answered in turn until it closes."""
        this = asyncio.current_task()
        assert this is not None
        self.connections.add(this)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return  # the client closed the connection
                request_line, *lines = head.decode("latin-1").split("\r\n")[:-2]
                method, target, _ = request_line.split(" ", 2)
                headers = {}
                for line in lines:
                    name, value = line.split(":", 1)
                    headers[name.strip().lower()] = value.strip()
                assert "transfer-encoding" not in headers, "the client sends a Content-Length"
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                status, answer = await self.handle(method, target, body)
                closing = headers.get("connection", "").lower() == "close"
                writer.write(
                    b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n%s\r\n%s"
                    % (
                        status,
                        HTTPStatus(status).phrase.encode(),
                        len(answer),
                        b"Connection: close\r\n" if closing else b"",
                        answer,
                    )
                )
                await writer.drain()
                if closing:
                    return
        finally:
            writer.transport.abort()
            self.connections.discard(this)

    async def handle(self, method: str, target: str, body: bytes) -> tuple[int, bytes]:
        self.seen.append((method, target))
        if self.failures < 0 or len(self.seen) <= self.failures:
            return 503, json.dumps(_UNAVAILABLE).encode()
        assert self.upstream is not None, "no apiserver behind this front"
        path, _, query = target.partition("?")
        # What the publisher asks while it probes: dry-run creates of ResourceSlices.
        if (method, unquote(path)) != ("POST", "/apis/resource.k8s.io/v1/resourceslices") or (
            "dryRun",
            "All",
        ) not in parse_qsl(query):
            return 404, b"{}"
        try:
            answer = await self.upstream.create(RESOURCE_SLICES, json.loads(body), dry_run=True)
        except ApiException as exc:
            return exc.status, exc.body
        return (201 if method == "POST" else 200), json.dumps(answer).encode()

    def kubeconfig(self, path: Path) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "flaky", "cluster": {"server": self.url}}],
            "users": [{"name": "anyone", "user": {}}],
            "contexts": [{"name": "flaky", "context": {"cluster": "flaky", "user": "anyone"}}],
            "current-context": "flaky",
        }
        path.write_text(json.dumps(config))
        return path


@pytest.fixture
async def kube(kube_stack: KubeStack) -> AsyncIterator[KubeClient]:
    client = await connect(kubeconfig=kube_stack.kubeconfig)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def flaky(tmp_path: Path) -> AsyncIterator[tuple[FlakyApiserver, Path]]:
    front = FlakyApiserver()
    server = await asyncio.start_server(front.serve, "127.0.0.1", 0)
    front.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield front, front.kubeconfig(tmp_path / "flaky.kubeconfig")
    finally:
        server.close()
        connections = list(front.connections)
        for connection in connections:
            connection.cancel()
        await asyncio.gather(*connections, return_exceptions=True)
        await server.wait_closed()


def ultraserver_node() -> NodeHardware:
    return NodeHardware(
        instance_type="trn2u.48xlarge",
        driver_version="2.24.7.0",
        devices=tuple(NeuronDevice(index=i) for i in range(16)),
        ultraserver=UltraServerInfo(
            server_id_4="00000000000000a1", node_id_4=0, supported_modes=(1, 2, 3, 4)
        ),
    )


@pytest.mark.stack
async def test_a_publisher_starting_during_apiserver_errors_waits_and_keeps_the_chips(
    kube: KubeClient, flaky: tuple[FlakyApiserver, Path]
) -> None:
    front, kubeconfig = flaky
    front.upstream = kube
    front.failures = 3
    cluster = await detect_mode(kube, "auto")
    client = await connect(kubeconfig=kubeconfig)
    try:
        mode = await detect_mode(client, "auto", patience=60)
        taints = await detect_taints(client, "auto", patience=60)
    finally:
        await client.close()
    assert len(front.seen) > 3, "the probe was answered only once the errors stopped"
    assert mode is cluster
    assert taints is await detect_taints(kube, "auto")
    # The default release keeps shared counters: UltraServer pools hold chips and node device.
    assert cluster is NodeDeviceMode.COUNTERS
    pool = build_pool(
        node="us-node-0",
        hardware=ultraserver_node(),
        labels={},
        mode=mode,
        dra_driver_version="0.1.0",
    )
    names = [d["name"] for part in pool.slices for d in part.devices]
    assert [n for n in names if n.startswith("neurondevice")] == [
        f"neurondevice{i}" for i in range(16)
    ]
    assert "neuronnode" in names


async def test_a_publisher_never_answered_refuses_to_guess(
    flaky: tuple[FlakyApiserver, Path],
) -> None:
    front, kubeconfig = flaky
    front.failures = -1
    client = await connect(kubeconfig=kubeconfig)
    try:
        with pytest.raises(FeatureUnknown) as raised:
            await detect_mode(client, "auto", patience=2)
    finally:
        await client.close()
    message = str(raised.value)
    assert "shared counters" in message
    assert "503" in message
    assert "NEURON_DRA_NODE_DEVICE" in message
    assert len(front.seen) > 1, "asked again before giving up"


def test_the_publisher_process_exits_naming_the_problem_and_writes_no_slice(
    flaky: tuple[FlakyApiserver, Path], nats_server: NatsServer
) -> None:
    front, kubeconfig = flaky
    front.failures = -1
    env = {
        **os.environ,
        "NEURON_DRA_KUBECONFIG": str(kubeconfig),
        **nats_server.open_env,
        "NEURON_DRA_HTTP_HOST": "127.0.0.1",
        "NEURON_DRA_HTTP_PORT": str(free_port()),
        "NEURON_DRA_LEASE_NAME": "feature-probe-test",
        "NEURON_DRA_PROBE_TIMEOUT": "3",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "neuron_dra_slice_publisher"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    said = proc.stdout + proc.stderr
    assert "cannot tell whether the cluster keeps shared counters" in said
    assert "Unclosed" not in said, "the failed start closed its connections"
    writes = [(m, p) for m, p in front.seen if m != "GET" and "dryRun=All" not in p]
    assert writes == [], "nothing but dry-run probes reached the apiserver"
