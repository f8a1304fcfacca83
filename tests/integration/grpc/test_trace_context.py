"""Trace context over the gRPC servers' unix sockets, called by the official gRPC client."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
from neuron_dra_common.grpcserver import Servable, UnixGrpcServer, unix_target
from neuron_dra_common.telemetry import inject_grpc_metadata, tracing_enabled
from neuron_dra_protos.dra.v1 import dra_pb2 as v1
from neuron_dra_protos.dra.v1 import dra_pb2_grpc as v1_grpc
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

METHOD = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"


_Context = grpc.aio.ServicerContext[Any, Any]


class Recorder(v1_grpc.DRAPluginServicer):
    """Answers every prepare with nothing and notes the trace it ran in."""

    def __init__(self) -> None:
        self.seen: list[trace.SpanContext] = []

    async def NodePrepareResources(
        self, request: v1.NodePrepareResourcesRequest, context: _Context
    ) -> v1.NodePrepareResourcesResponse:
        self.seen.append(trace.get_current_span().get_span_context())
        return v1.NodePrepareResourcesResponse()

    async def NodeUnprepareResources(
        self, request: v1.NodeUnprepareResourcesRequest, context: _Context
    ) -> v1.NodeUnprepareResourcesResponse:
        return v1.NodeUnprepareResourcesResponse()


@asynccontextmanager
async def serving(recorder: Recorder, tracer: trace.Tracer | None = None) -> AsyncIterator[Any]:
    """A stub on an asyncio channel (whose calls are awaited; the generated stub's types
    describe the blocking one, hence ``Any``)."""
    with tempfile.TemporaryDirectory(prefix="tc-", dir="/tmp") as tmp:
        path = Path(tmp) / "dra.sock"
        async with (
            UnixGrpcServer(
                path,
                services=[Servable(v1_grpc.add_DRAPluginServicer_to_server, recorder)],
                tracer=tracer,
            ),
            grpc.aio.insecure_channel(unix_target(path)) as channel,
        ):
            yield v1_grpc.DRAPluginStub(channel)


def caller() -> tuple[trace.Tracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("kubelet"), exporter


async def test_a_recording_server_makes_a_span_under_the_callers() -> None:
    kubelet, exporter = caller()
    recorder = Recorder()
    async with serving(recorder, kubelet) as stub:
        with kubelet.start_as_current_span("kubelet prepares") as root:
            await stub.NodePrepareResources(
                v1.NodePrepareResourcesRequest(), metadata=inject_grpc_metadata([])
            )
    spans = {s.name: s for s in exporter.get_finished_spans()}
    server = spans[METHOD]
    assert server.kind is trace.SpanKind.SERVER
    assert server.parent is not None
    assert server.parent.span_id == root.get_span_context().span_id
    assert recorder.seen == [server.context]


async def test_with_tracing_off_the_handler_still_runs_in_the_callers_trace() -> None:
    assert not tracing_enabled()  # no provider installed in the test process
    kubelet, exporter = caller()
    recorder = Recorder()
    async with serving(recorder) as stub:
        with kubelet.start_as_current_span("kubelet prepares") as root:
            await stub.NodePrepareResources(
                v1.NodePrepareResourcesRequest(), metadata=inject_grpc_metadata([])
            )
        await stub.NodePrepareResources(v1.NodePrepareResourcesRequest())
    with_parent, without = recorder.seen
    assert with_parent.trace_id == root.get_span_context().trace_id
    assert with_parent.span_id == root.get_span_context().span_id
    assert not without.is_valid
    # Only the caller's own span was recorded: the server made none.
    assert [s.name for s in exporter.get_finished_spans()] == ["kubelet prepares"]
