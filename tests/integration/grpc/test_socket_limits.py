"""What the unix-socket gRPC server promises a node about its socket and its input, checked
with grpcio's client over a real socket: the file's mode, a stale socket replaced and ours
removed, a message over the limit refused, connections closed when it stops, and no gRPC
thread before a service runs (so a launcher may fork after importing it)."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from neuron_dra_common.grpcserver import (
    MAX_RECEIVE_BYTES,
    SOCKET_MODE,
    Servable,
    UnixGrpcServer,
    unix_target,
)
from neuron_dra_protos.dra.v1 import dra_pb2 as v1
from neuron_dra_protos.dra.v1 import dra_pb2_grpc as v1_grpc

_Context = grpc.aio.ServicerContext[Any, Any]


class Echo(v1_grpc.DRAPluginServicer):
    """Answers every prepare with one entry per claim, named after the claim."""

    async def NodePrepareResources(
        self, request: v1.NodePrepareResourcesRequest, context: _Context
    ) -> v1.NodePrepareResourcesResponse:
        response = v1.NodePrepareResourcesResponse()
        for claim in request.claims:
            response.claims[claim.uid].error = f"seen {len(claim.name)} bytes"
        return response

    async def NodeUnprepareResources(
        self, request: v1.NodeUnprepareResourcesRequest, context: _Context
    ) -> v1.NodeUnprepareResourcesResponse:
        return v1.NodeUnprepareResourcesResponse()


def echo() -> Servable:
    return Servable(v1_grpc.add_DRAPluginServicer_to_server, Echo())


@pytest.fixture
def directory() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="sl-", dir="/tmp") as tmp:
        yield Path(tmp)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def _claim(size: int) -> v1.NodePrepareResourcesRequest:
    return v1.NodePrepareResourcesRequest(
        claims=[v1.Claim(namespace="default", name="x" * size, uid="u1")]
    )


async def test_the_socket_is_owner_only_and_nothing_else_is_left_in_its_directory(
    directory: Path,
) -> None:
    path = directory / "dra.sock"
    async with UnixGrpcServer(path, services=[echo()]):
        assert path.is_socket()
        assert _mode(path) == SOCKET_MODE == 0o600
        assert sorted(os.listdir(directory)) == ["dra.sock"]
    async with UnixGrpcServer(path, services=[echo()], mode=0o660):
        assert _mode(path) == 0o660


async def test_a_stale_socket_is_replaced_and_ours_removed_on_stop_but_not_a_successors(
    directory: Path,
) -> None:
    path = directory / "dra.sock"
    with socket.socket(socket.AF_UNIX) as stale:
        stale.bind(str(path))  # nobody listens: a killed process left it
    first = UnixGrpcServer(path, services=[echo()])
    await first.start()
    async with grpc.aio.insecure_channel(unix_target(path)) as channel:
        answer = await v1_grpc.DRAPluginStub(channel).NodePrepareResources(_claim(3), timeout=5)
    assert answer.claims["u1"].error == "seen 3 bytes"
    # A successor binds the same path while the first still runs (a rolling restart).
    async with UnixGrpcServer(path, services=[echo()]):
        await first.stop()
        assert path.is_socket()  # the successor's: left alone
    assert not path.exists()


async def test_a_message_over_the_limit_is_refused_and_the_server_goes_on(
    directory: Path,
) -> None:
    path = directory / "dra.sock"
    # The client may send anything (grpcio's default); the server's limit decides.
    async with (
        UnixGrpcServer(path, services=[echo()]),
        grpc.aio.insecure_channel(
            unix_target(path), options=[("grpc.max_send_message_length", -1)]
        ) as channel,
    ):
        stub = v1_grpc.DRAPluginStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.NodePrepareResources(_claim(MAX_RECEIVE_BYTES + 1), timeout=10)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # Just under the limit (the claim's framing takes a few bytes) is served.
        near = await stub.NodePrepareResources(_claim(MAX_RECEIVE_BYTES - 64), timeout=10)
        assert near.claims["u1"].error == f"seen {MAX_RECEIVE_BYTES - 64} bytes"


async def test_a_smaller_limit_is_kept_too(directory: Path) -> None:
    path = directory / "dra.sock"
    async with (
        UnixGrpcServer(path, services=[echo()], max_receive_bytes=1024),
        grpc.aio.insecure_channel(unix_target(path)) as channel,
    ):
        stub = v1_grpc.DRAPluginStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.NodePrepareResources(_claim(2048), timeout=5)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        small = await stub.NodePrepareResources(_claim(100), timeout=5)
        assert small.claims["u1"].error == "seen 100 bytes"


async def test_a_client_kept_connected_is_disconnected_when_the_server_stops(
    directory: Path,
) -> None:
    path = directory / "dra.sock"
    server = UnixGrpcServer(path, services=[echo()])
    await server.start()
    async with grpc.aio.insecure_channel(unix_target(path)) as channel:
        await v1_grpc.DRAPluginStub(channel).NodePrepareResources(_claim(1), timeout=5)
        assert channel.get_state() is grpc.ChannelConnectivity.READY
        await server.stop()
        async with asyncio.timeout(5):
            while channel.get_state() is grpc.ChannelConnectivity.READY:
                await channel.wait_for_state_change(grpc.ChannelConnectivity.READY)


# Imports what a node agent serves with, forks, and serves and calls in the child (then in
# the parent too): what a launcher that imports once and forks its agents does.
_FORK = """
import asyncio, os, sys, tempfile
from pathlib import Path
import grpc
from neuron_dra_common.grpcserver import Servable, UnixGrpcServer, unix_channel
from neuron_dra_kubelet_plugin.servers import serve  # noqa: F401  the plugin's wiring too
from neuron_dra_protos.registration.v1 import registration_pb2 as pb, registration_pb2_grpc as pb_grpc

class Info(pb_grpc.RegistrationServicer):
    async def GetInfo(self, request, context):
        return pb.PluginInfo(name=str(os.getpid()))

async def call_own_server():
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        path = Path(tmp) / "r.sock"
        async with UnixGrpcServer(path, services=[Servable(pb_grpc.add_RegistrationServicer_to_server, Info())]):
            async with unix_channel(path) as channel:
                info = await pb_grpc.RegistrationStub(channel).GetInfo(pb.InfoRequest(), timeout=10)
    assert info.name == str(os.getpid()), info

threads = len(os.listdir("/proc/self/task"))
pid = os.fork()
if pid == 0:
    asyncio.run(call_own_server())
    os._exit(0)
_, status = os.waitpid(pid, 0)
asyncio.run(call_own_server())
print(threads, os.waitstatus_to_exitcode(status), flush=True)
"""


def test_modules_imported_before_a_fork_serve_in_the_child() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _FORK],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GRPC_"))},
    )
    assert out.returncode == 0, out.stderr
    threads, child = out.stdout.split()
    assert (threads, child) == ("1", "0"), out.stderr
