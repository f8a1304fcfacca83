"""The unix-socket gRPC server stops the way the kubelet needs: a call under way is answered
(within the grace period), a stream ends at once, and the socket goes with the server."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from neuron_dra_common.grpcserver import Servable, UnixGrpcServer, unix_target
from neuron_dra_protos.dra.v1 import dra_pb2 as v1
from neuron_dra_protos.dra.v1 import dra_pb2_grpc as v1_grpc
from neuron_dra_protos.health.v1alpha1 import health_pb2, health_pb2_grpc

_Context = grpc.aio.ServicerContext[Any, Any]


class Slow(v1_grpc.DRAPluginServicer):
    """Takes ``seconds`` to answer a prepare."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.started = asyncio.Event()

    async def NodePrepareResources(
        self, request: v1.NodePrepareResourcesRequest, context: _Context
    ) -> v1.NodePrepareResourcesResponse:
        self.started.set()
        await asyncio.sleep(self.seconds)
        response = v1.NodePrepareResourcesResponse()
        response.claims["u1"].error = "answered"
        return response

    async def NodeUnprepareResources(
        self, request: v1.NodeUnprepareResourcesRequest, context: _Context
    ) -> v1.NodeUnprepareResourcesResponse:
        return v1.NodeUnprepareResourcesResponse()

    def service(self) -> Servable:
        return Servable(v1_grpc.add_DRAPluginServicer_to_server, self)


def _gone(path: Path) -> bool:
    return not path.exists()


@pytest.fixture
def socket_path() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="us-", dir="/tmp") as tmp:
        yield Path(tmp) / "dra.sock"


async def _stop_during_a_prepare(
    socket_path: Path, slow: Slow, *, grace: float
) -> v1.NodePrepareResourcesResponse | grpc.aio.AioRpcError:
    """Stop the server while a prepare is under way: its answer, or the error it ended with."""
    server = UnixGrpcServer(socket_path, services=[slow.service()], grace_seconds=grace)
    await server.start()
    async with grpc.aio.insecure_channel(unix_target(socket_path)) as channel:
        call = asyncio.ensure_future(
            v1_grpc.DRAPluginStub(channel).NodePrepareResources(
                v1.NodePrepareResourcesRequest(), timeout=10
            )
        )
        await asyncio.wait_for(slow.started.wait(), 10)
        async with asyncio.timeout(grace + 5):
            await server.stop()
        try:
            response: v1.NodePrepareResourcesResponse = await call
        except grpc.aio.AioRpcError as exc:
            return exc
        return response


async def test_a_call_under_way_is_answered_before_the_server_stops(socket_path: Path) -> None:
    answer = await _stop_during_a_prepare(socket_path, Slow(0.3), grace=5.0)
    assert isinstance(answer, v1.NodePrepareResourcesResponse), answer
    assert answer.claims["u1"].error == "answered"
    assert _gone(socket_path)


async def test_a_call_past_the_grace_is_cut_and_the_server_stops(socket_path: Path) -> None:
    answer = await _stop_during_a_prepare(socket_path, Slow(30), grace=0.2)
    assert isinstance(answer, grpc.aio.AioRpcError), answer
    assert _gone(socket_path)


class Watch(health_pb2_grpc.DRAResourceHealthServicer):
    """A health stream that sends once, then nothing until it is ended."""

    async def NodeWatchResources(
        self, request: health_pb2.NodeWatchResourcesRequest, context: _Context
    ) -> AsyncIterator[health_pb2.NodeWatchResourcesResponse]:
        yield health_pb2.NodeWatchResourcesResponse()
        await asyncio.Event().wait()
        yield health_pb2.NodeWatchResourcesResponse()  # never reached


async def test_a_stream_ends_at_once_and_the_stop_waits_out_no_grace(socket_path: Path) -> None:
    server = UnixGrpcServer(
        socket_path,
        services=[Servable(health_pb2_grpc.add_DRAResourceHealthServicer_to_server, Watch())],
        grace_seconds=30,
    )
    await server.start()
    async with grpc.aio.insecure_channel(unix_target(socket_path)) as channel:
        stream = health_pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            health_pb2.NodeWatchResourcesRequest()
        )
        assert isinstance(await stream.read(), health_pb2.NodeWatchResourcesResponse)
        async with asyncio.timeout(5):  # far less than the grace
            await server.stop()
            assert await stream.read() is grpc.aio.EOF
        assert await stream.code() is grpc.StatusCode.OK
    assert _gone(socket_path)
