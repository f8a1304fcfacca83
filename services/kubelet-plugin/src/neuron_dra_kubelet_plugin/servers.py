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

from grpc_health.v1 import health_pb2 as grpc_health_pb2
from grpc_health.v1 import health_pb2_grpc as grpc_health_pb2_grpc
from grpc_health.v1.health import aio as grpc_health
from neuron_dra_common.driver import DRIVER_NAME
from neuron_dra_common.grpcserver import Servable, UnixGrpcServer

from neuron_dra_kubelet_plugin.draservice import DraService, dra_plugin_services
from neuron_dra_kubelet_plugin.health import (
    DEFAULT_HEARTBEAT_SECONDS,
    HealthServicer,
    HealthSource,
    health_service,
)
from neuron_dra_kubelet_plugin.preparer import Preparer
from neuron_dra_kubelet_plugin.registration import (
    RegistrationServicer,
    SocketPaths,
    registration_service,
)

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
    driver: str = DRIVER_NAME,
) -> AsyncIterator[PluginServers]:
    """Run both servers for the duration of the ``async with`` block; the kubelet knows
    them as ``driver``'s."""
    service = DraService(preparer)
    registration = RegistrationServicer(endpoint=paths.dra, driver=driver)
    # The whole server's status (service ""): NOT_SERVING until both sockets serve.
    checks = grpc_health.HealthServicer()
    await checks.set("", grpc_health_pb2.HealthCheckResponse.NOT_SERVING)
    status = Servable(grpc_health_pb2_grpc.add_HealthServicer_to_server, checks)
    dra = UnixGrpcServer(
        paths.dra,
        services=[
            *dra_plugin_services(service),
            health_service(HealthServicer(health, heartbeat_seconds=heartbeat_seconds)),
            status,
        ],
    )
    registrar = UnixGrpcServer(
        paths.registration, services=[registration_service(registration), status]
    )
    async with dra, registrar:
        await checks.set("", grpc_health_pb2.HealthCheckResponse.SERVING)
        try:
            yield PluginServers(dra=dra, registrar=registrar, registration=registration)
        finally:
            await checks.enter_graceful_shutdown()
