"""Liveness that exercises both sockets as the kubelet would, and gRPC health on them.

A process can be running with a socket file that no longer answers: deleted by someone
cleaning the plugin directory, or an event loop wedged behind a stuck call. So the probe
dials each socket and makes a real call: ``GetInfo`` on the registration socket, and on the
DRA socket a gRPC health check plus an empty ``NodePrepareResources`` (the servicer path the
kubelet uses, with no claim to touch). ``/healthz`` fails once no round succeeded for
``failures_allowed`` intervals, and Kubernetes restarts the pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from neuron_dra_common.grpcserver import unix_channel
from neuron_dra_protos.dra.v1 import dra_pb2, dra_pb2_grpc
from neuron_dra_protos.registration.v1 import registration_pb2, registration_pb2_grpc

from neuron_dra_kubelet_plugin.registration import SocketPaths

__all__ = ["PROBE_FAILURES", "SocketProbe", "probe_sockets"]

log = logging.getLogger(__name__)


#: What a failed round raises: an error answer (no socket and no answer in time are gRPC
#: errors too: UNAVAILABLE, DEADLINE_EXCEEDED), or a health that is not SERVING.
PROBE_FAILURES = (grpc.aio.AioRpcError, OSError, TimeoutError, RuntimeError)


async def probe_sockets(paths: SocketPaths, *, call_timeout: float = 5.0) -> None:
    """One round of calls on both sockets; raises one of :data:`PROBE_FAILURES` when one
    fails."""
    async with unix_channel(paths.registration) as channel:
        await registration_pb2_grpc.RegistrationStub(channel).GetInfo(
            registration_pb2.InfoRequest(), timeout=call_timeout
        )
        status = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=call_timeout
        )
        _serving(status, paths.registration.name)
    async with unix_channel(paths.dra) as channel:
        status = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=call_timeout
        )
        _serving(status, paths.dra.name)
        await dra_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
            dra_pb2.NodePrepareResourcesRequest(), timeout=call_timeout
        )


def _serving(status: Any, socket: str) -> None:
    if status.status != health_pb2.HealthCheckResponse.SERVING:
        name = health_pb2.HealthCheckResponse.ServingStatus.Name(status.status)
        raise RuntimeError(f"socket {socket}: gRPC health is {name}")


class SocketProbe:
    """Probes both sockets every ``interval`` seconds; :meth:`alive` is the liveness check."""

    def __init__(
        self,
        paths: SocketPaths,
        *,
        interval: float = 10.0,
        timeout: float = 5.0,
        failures_allowed: int = 3,
    ) -> None:
        self._paths = paths
        self._interval = interval
        self._timeout = timeout
        self._window = interval * failures_allowed + timeout
        self._last_ok = time.monotonic()
        self._stop = asyncio.Event()
        self.rounds = 0
        self.last_error = ""

    def alive(self) -> bool:
        return time.monotonic() - self._last_ok <= self._window

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        while not self._stop.is_set():
            try:
                await probe_sockets(self._paths, call_timeout=self._timeout)
                self._last_ok = time.monotonic()
                self.last_error = ""
            except PROBE_FAILURES as exc:
                self.last_error = str(exc)
                log.warning("socket probe failed", extra={"error": self.last_error})
            self.rounds += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=self._interval)
