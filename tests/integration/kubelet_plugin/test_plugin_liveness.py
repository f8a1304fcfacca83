"""Liveness calls both sockets for real; both serve gRPC health (checked with grpcio's
client, as the kubelet's gRPC-Go would call it)."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2
from neuron_dra_kubelet_plugin.checkpoint import CheckpointStore
from neuron_dra_kubelet_plugin.health import StaticHealth
from neuron_dra_kubelet_plugin.liveness import PROBE_FAILURES, SocketProbe, probe_sockets
from neuron_dra_kubelet_plugin.preparer import Effects, NodePreparer
from neuron_dra_kubelet_plugin.registration import SocketPaths, socket_paths
from neuron_dra_kubelet_plugin.servers import serve

from tests.unit.kubelet_plugin.support import NODE, MemoryClaims, trn2_node


@pytest.fixture
async def paths() -> AsyncIterator[SocketPaths]:
    with tempfile.TemporaryDirectory(prefix="kp-", dir="/tmp") as short:
        root = Path(short)
        preparer = NodePreparer(
            node=trn2_node(),
            claims=MemoryClaims([]),
            effects=Effects(store=CheckpointStore(root / "ck.json"), cdi_root=root / "cdi"),
            boot_id="b",
        )
        sockets = socket_paths(root / "kubelet")
        health = StaticHealth(pool=NODE, devices=["neurondevice0"])
        async with serve(sockets, preparer=preparer, health=health):
            yield sockets


async def test_both_sockets_answer_and_report_serving(paths: SocketPaths) -> None:
    await probe_sockets(paths)
    for socket in (paths.registration, paths.dra):
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            check = channel.unary_unary(
                "/grpc.health.v1.Health/Check",
                request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                response_deserializer=health_pb2.HealthCheckResponse.FromString,
            )
            status = await check(health_pb2.HealthCheckRequest(), timeout=5)
        assert status.status == health_pb2.HealthCheckResponse.SERVING


async def test_a_removed_socket_fails_liveness(paths: SocketPaths) -> None:
    probe = SocketProbe(paths, interval=0.05, timeout=0.5, failures_allowed=1)
    paths.dra.unlink()
    with pytest.raises(PROBE_FAILURES):
        await probe_sockets(paths, call_timeout=0.5)
    probe._last_ok -= 10  # as if the last good round was long ago
    assert not probe.alive()
