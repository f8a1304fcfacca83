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

from grpclib.health.check import ServiceStatus
from grpclib.health.service import OVERALL, Health
from neuron_dra_common.grpcserver import UnixGrpcServer

from neuron_dra_kubelet_plugin.draservice import DraService, dra_plugin_services
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
    serving = ServiceStatus()
    status = Health({OVERALL: [serving]})
    dra = UnixGrpcServer(
        paths.dra,
        services=[
            *dra_plugin_services(service),
            HealthServicer(health, heartbeat_seconds=heartbeat_seconds),
            status,
        ],
    )
    registrar = UnixGrpcServer(paths.registration, services=[registration, status])
    async with dra, registrar:
        serving.set(True)
        try:
            yield PluginServers(dra=dra, registrar=registrar, registration=registration)
        finally:
            serving.set(False)
