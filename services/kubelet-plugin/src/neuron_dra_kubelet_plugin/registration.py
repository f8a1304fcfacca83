"""Kubelet plugin registration: socket paths and the ``pluginregistration.Registration`` servicer.

The kubelet's plugin watcher finds ``<kubelet-root>/plugins_registry/<driver>-reg.sock``,
asks :meth:`RegistrationServicer.GetInfo` where the DRA service listens, connects to it,
and reports the outcome with ``NotifyRegistrationStatus``. During a rolling update two
plugin pods run side by side, so with a pod UID both sockets get per-pod names.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc
import msgspec
from neuron_dra_common.driver import DRIVER_NAME
from neuron_dra_common.grpcserver import Servable
from neuron_dra_protos.registration.v1 import registration_pb2, registration_pb2_grpc

__all__ = [
    "DEFAULT_KUBELET_ROOT",
    "DRA_PLUGIN_TYPE",
    "SUPPORTED_VERSIONS",
    "RegistrationServicer",
    "RegistrationStatus",
    "SocketPaths",
    "registration_service",
    "socket_paths",
]

log = logging.getLogger(__name__)

DEFAULT_KUBELET_ROOT = Path("/var/lib/kubelet")
DRA_PLUGIN_TYPE = "DRAPlugin"
#: Most preferred first: the kubelet picks the first one it also speaks.
SUPPORTED_VERSIONS: tuple[str, ...] = ("v1.DRAPlugin", "v1beta1.DRAPlugin")


class SocketPaths(msgspec.Struct, frozen=True, kw_only=True):
    """Where the two sockets of the plugin live (absolute host paths)."""

    registration: Path
    dra: Path


def socket_paths(
    kubelet_root: Path, *, driver: str = DRIVER_NAME, pod_uid: str | None = None
) -> SocketPaths:
    """The plugin's socket paths under ``kubelet_root``.

    >>> socket_paths(Path("/var/lib/kubelet")).dra
    PosixPath('/var/lib/kubelet/plugins/neuron.aws.com/dra.sock')
    >>> socket_paths(Path("/k"), pod_uid="p1").registration
    PosixPath('/k/plugins_registry/neuron.aws.com-p1-reg.sock')
    """
    root = kubelet_root.absolute()
    if pod_uid:
        return SocketPaths(
            registration=root / "plugins_registry" / f"{driver}-{pod_uid}-reg.sock",
            dra=root / "plugins" / driver / f"dra-{pod_uid}.sock",
        )
    return SocketPaths(
        registration=root / "plugins_registry" / f"{driver}-reg.sock",
        dra=root / "plugins" / driver / "dra.sock",
    )


class RegistrationStatus(msgspec.Struct, frozen=True, kw_only=True):
    """The kubelet's last word on the registration."""

    registered: bool
    error: str = ""


class RegistrationServicer(registration_pb2_grpc.RegistrationServicer):
    """Answers the kubelet's plugin watcher and records what it reports back."""

    def __init__(
        self,
        *,
        endpoint: Path,
        driver: str = DRIVER_NAME,
        versions: tuple[str, ...] = SUPPORTED_VERSIONS,
    ) -> None:
        if not endpoint.is_absolute():
            raise ValueError(f"DRA endpoint {endpoint}: the kubelet needs an absolute path")
        self._info = registration_pb2.PluginInfo(
            type=DRA_PLUGIN_TYPE,
            name=driver,
            endpoint=str(endpoint),
            supported_versions=list(versions),
        )
        self.status: RegistrationStatus | None = None
        self.registered = asyncio.Event()

    async def GetInfo(
        self,
        request: registration_pb2.InfoRequest,
        context: grpc.aio.ServicerContext[
            registration_pb2.InfoRequest, registration_pb2.PluginInfo
        ],
    ) -> registration_pb2.PluginInfo:
        return self._info

    async def NotifyRegistrationStatus(
        self,
        request: registration_pb2.RegistrationStatus,
        context: grpc.aio.ServicerContext[
            registration_pb2.RegistrationStatus, registration_pb2.RegistrationStatusResponse
        ],
    ) -> registration_pb2.RegistrationStatusResponse:
        self.status = RegistrationStatus(registered=request.plugin_registered, error=request.error)
        if request.plugin_registered:
            log.info("kubelet registered driver %s", self._info.name)
            self.registered.set()
        else:
            log.error("kubelet refused driver %s: %s", self._info.name, request.error)
            self.registered.clear()
        return registration_pb2.RegistrationStatusResponse()


def registration_service(servicer: RegistrationServicer) -> Servable:
    """``servicer`` as a server registers it."""
    return Servable(registration_pb2_grpc.add_RegistrationServicer_to_server, servicer)
