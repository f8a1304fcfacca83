"""``python -m bench.grpc_floor SOCKET``: a DRA plugin that answers every claim from memory,
served as the kubelet plugin serves (``UnixGrpcServer`` on ``grpc.aio``, uvloop).

What the prepare benchmark measures it for: the CPU gRPC alone costs per prepare/unprepare
cycle in Python, so the plugin's own share (API read, checkpoint, CDI, events) can be told
apart from it. SIGTERM stops it.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

import grpc
import uvloop
from neuron_dra_common.grpcserver import Servable, UnixGrpcServer
from neuron_dra_protos.dra.v1 import dra_pb2 as v1
from neuron_dra_protos.dra.v1 import dra_pb2_grpc as v1_grpc

_Context = grpc.aio.ServicerContext[Any, Any]


class Floor(v1_grpc.DRAPluginServicer):
    """One device per claim, the same for every claim; unprepare answers empty entries."""

    async def NodePrepareResources(
        self, request: v1.NodePrepareResourcesRequest, context: _Context
    ) -> v1.NodePrepareResourcesResponse:
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

    async def NodeUnprepareResources(
        self, request: v1.NodeUnprepareResourcesRequest, context: _Context
    ) -> v1.NodeUnprepareResourcesResponse:
        response = v1.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            response.claims[claim.uid].error = ""
        return response


async def serve(path: Path) -> None:
    stopped = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopped.set)
    service = Servable(v1_grpc.add_DRAPluginServicer_to_server, Floor())
    async with UnixGrpcServer(path, services=[service]):
        await stopped.wait()


if __name__ == "__main__":
    uvloop.run(serve(Path(sys.argv[1])))
