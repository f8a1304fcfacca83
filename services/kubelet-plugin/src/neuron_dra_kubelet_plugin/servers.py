"""The plugin's two gRPC servers, wired to a preparer and a health source.

- the DRA socket serves ``DRAPlugin`` v1 and v1beta1 and ``v1alpha1.DRAResourceHealth``;
- the registration socket serves ``pluginregistration.Registration``;
- both serve ``grpc.health.v1.Health`` (SERVING while up, NOT_SERVING while stopping).

The DRA server starts first and stops last: the kubelet dials the endpoint as soon as it
sees the registration socket, and must not find it missing.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from functools import partial

from grpc_health.v1 import health as grpc_health
from grpc_health.v1 import health_pb2 as grpc_health_pb2
from grpc_health.v1 import health_pb2_grpc as grpc_health_grpc
from neuron_dra_common.grpcserver import UnixGrpcServer
from neuron_dra_protos.health.v1alpha1 import health_pb2_grpc
from neuron_dra_protos.registration.v1 import registration_pb2_grpc

from neuron_dra_kubelet_plugin.draservice import DraService, dra_plugin_registrars
from neuron_dra_kubelet_plugin.health import (
    DEFAULT_HEARTBEAT_SECONDS,
    HealthServicer,
    HealthSource,
)
from neuron_dra_kubelet_plugin.preparer import Preparer
from neuron_dra_kubelet_plugin.registration import RegistrationServicer, SocketPaths

__all__ = ["PluginServers", "serve"]


class PluginServers:
    """The running servers; ``registration`` records what the kubelet reported."""

    def __init__(
        self, *, dra: UnixGrpcServer, registrar: UnixGrpcServer, registration: RegistrationServicer
    ) -> None:
        self.dra = dra
        self.registrar = registrar
        self.registration = registration


@contextlib.asynccontextmanager
async def serve(
    paths: SocketPaths,
    *,
    preparer: Preparer,
    health: HealthSource,
    heartbeat_seconds: float = DEFAULT_HEARTBEAT_SECONDS,
) -> AsyncIterator[PluginServers]:
    """Run both servers for the duration of the ``async with`` block."""
    service = DraService(preparer)
    registration = RegistrationServicer(endpoint=paths.dra)
    status = grpc_health.aio.HealthServicer()
    add_status = partial(grpc_health_grpc.add_HealthServicer_to_server, status)
    dra = UnixGrpcServer(
        paths.dra,
        registrars=[
            *dra_plugin_registrars(service),
            partial(
                health_pb2_grpc.add_DRAResourceHealthServicer_to_server,
                HealthServicer(health, heartbeat_seconds=heartbeat_seconds),
            ),
            add_status,
        ],
    )
    registrar = UnixGrpcServer(
        paths.registration,
        registrars=[
            partial(registration_pb2_grpc.add_RegistrationServicer_to_server, registration),
            add_status,
        ],
    )
    async with dra, registrar:
        await status.set("", grpc_health_pb2.HealthCheckResponse.SERVING)
        try:
            yield PluginServers(dra=dra, registrar=registrar, registration=registration)
        finally:
            await status.enter_graceful_shutdown()
