"""``python -m bench.grpc_floor SOCKET [MODE]``: a DRA plugin that answers every claim from
memory, served in one of these ways (``MODE``, ``aio`` unless told):

* ``aio``: as the kubelet plugin serves (``UnixGrpcServer`` on ``grpc.aio``, uvloop);
* ``aio-bare``: a bare ``grpc.aio`` server (no interceptor), uvloop;
* ``sync``: grpcio's synchronous ``grpc.server`` with a pool of :data:`WORKERS` threads;
* ``sync-hop``: the synchronous server, each call handed to an asyncio (uvloop) loop in a
  thread of its own with ``asyncio.run_coroutine_threadsafe`` and waited for, as a plugin
  whose logic is asyncio would have to serve from it.

What the prepare benchmark measures it for: the CPU gRPC alone costs per prepare/unprepare
cycle in Python, so the plugin's own share (API read, checkpoint, CDI, events) can be told
apart from it; :mod:`bench.floors` compares the modes. SIGTERM stops it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import uvloop
from neuron_dra_common.grpcserver import Servable, UnixGrpcServer, channel_options, unix_target
from neuron_dra_protos.dra.v1 import dra_pb2 as v1
from neuron_dra_protos.dra.v1 import dra_pb2_grpc as v1_grpc

MODES = ("aio", "aio-bare", "sync", "sync-hop")
#: Threads of the synchronous server's pool.
WORKERS = int(os.environ.get("NEURON_DRA_FLOOR_WORKERS", "4"))
#: Server options beyond the plugin's, to try: ``MODE+NAME`` serves ``MODE`` with them.
VARIANTS: dict[str, list[tuple[str, Any]]] = {
    "nobdp": [("grpc.http2.bdp_probe", 0)],
    "latency": [("grpc.optimization_target", "latency")],
    "throughput": [("grpc.optimization_target", "throughput")],
    "wait": [],
}

_Context = grpc.aio.ServicerContext[Any, Any]


def _prepared(request: v1.NodePrepareResourcesRequest) -> v1.NodePrepareResourcesResponse:
    response = v1.NodePrepareResourcesResponse()
    for claim in request.claims:
        response.claims[claim.uid].devices.append(
            v1.Device(
                request_names=["neurons"],
                pool_name="floor",
                device_name="neurondevice0",
                cdi_device_ids=[f"neuron.aws.com/neuron={claim.uid}-neurondevice0"],
            )
        )
    return response


def _unprepared(request: v1.NodeUnprepareResourcesRequest) -> v1.NodeUnprepareResourcesResponse:
    response = v1.NodeUnprepareResourcesResponse()
    for claim in request.claims:
        response.claims[claim.uid].error = ""
    return response


#: ``MODE+wait``: every prepare first waits this long (seconds), as the plugin waits for
#: its GET of the claim, so calls arrive at the plugin's pace rather than as fast as
#: the floor answers.
WAIT = 0.002


class Floor(v1_grpc.DRAPluginServicer):
    """One device per claim, the same for every claim; unprepare answers empty entries."""

    def __init__(self, wait: float = 0.0) -> None:
        self._wait = wait

    async def NodePrepareResources(
        self, request: v1.NodePrepareResourcesRequest, context: _Context
    ) -> v1.NodePrepareResourcesResponse:
        if self._wait:
            await asyncio.sleep(self._wait)
        return _prepared(request)

    async def NodeUnprepareResources(
        self, request: v1.NodeUnprepareResourcesRequest, context: _Context
    ) -> v1.NodeUnprepareResourcesResponse:
        return _unprepared(request)


class SyncFloor(v1_grpc.DRAPluginServicer):
    """:class:`Floor` answered in the server's worker thread."""

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        return _prepared(request)

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        return _unprepared(request)


class HopFloor(v1_grpc.DRAPluginServicer):
    """:class:`Floor`, each call run on an asyncio loop of its own thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._floor = Floor()

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        call = self._floor.NodePrepareResources(request, context)
        return asyncio.run_coroutine_threadsafe(call, self._loop).result()

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        call = self._floor.NodeUnprepareResources(request, context)
        return asyncio.run_coroutine_threadsafe(call, self._loop).result()


async def serve(
    path: Path, mode: str = "aio", extra: list[tuple[str, Any]] | None = None, wait: float = 0.0
) -> None:
    stopped = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopped.set)
    if mode == "aio":
        service = Servable(v1_grpc.add_DRAPluginServicer_to_server, Floor(wait))
        async with UnixGrpcServer(path, services=[service]):
            await stopped.wait()
        return
    server = grpc.aio.server(options=channel_options() + (extra or []))
    v1_grpc.add_DRAPluginServicer_to_server(Floor(wait), server)
    server.add_insecure_port(unix_target(path))
    await server.start()
    await stopped.wait()
    await server.stop(None)


def serve_sync(path: Path, mode: str, extra: list[tuple[str, Any]] | None = None) -> None:
    loop: asyncio.AbstractEventLoop | None = None
    if mode == "sync-hop":
        loop = uvloop.new_event_loop()
        threading.Thread(target=loop.run_forever, name="loop", daemon=True).start()
        servicer: v1_grpc.DRAPluginServicer = HopFloor(loop)
    else:
        servicer = SyncFloor()
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=WORKERS), options=channel_options() + (extra or [])
    )
    v1_grpc.add_DRAPluginServicer_to_server(servicer, server)
    server.add_insecure_port(unix_target(path))
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    server.start()
    stopped.wait()
    server.stop(None).wait()
    if loop is not None:
        loop.call_soon_threadsafe(loop.stop)


if __name__ == "__main__":
    socket, chosen = Path(sys.argv[1]), (sys.argv[2] if len(sys.argv) > 2 else "aio")
    chosen, _, variant = chosen.partition("+")
    if chosen not in MODES or (variant and variant not in VARIANTS):
        raise SystemExit(f"mode {chosen!r}: one of {', '.join(MODES)} (+{'|'.join(VARIANTS)})")
    options = VARIANTS.get(variant, [])
    if chosen.startswith("sync"):
        serve_sync(socket, chosen, options)
    else:
        uvloop.run(serve(socket, chosen, options, WAIT if variant == "wait" else 0.0))
