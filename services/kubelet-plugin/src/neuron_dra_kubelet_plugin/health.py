"""The DRA health stream (``v1alpha1.DRAResourceHealth``) over a :class:`HealthSource`.

The stream sends the health of every device of the node at once, then again whenever the
source reports a change and at least every heartbeat interval, so the kubelet never marks
a device unknown for lack of news.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import time
from collections.abc import AsyncIterator, Iterable
from typing import Protocol

import grpc
import msgspec
from neuron_dra_common.grpcserver import Servable
from neuron_dra_protos.health.v1alpha1 import health_pb2, health_pb2_grpc

__all__ = [
    "DEFAULT_HEARTBEAT_SECONDS",
    "DeviceHealthReport",
    "Health",
    "HealthServicer",
    "HealthSource",
    "StaticHealth",
    "health_service",
]

#: Well inside the kubelet's default 30 s health timeout.
DEFAULT_HEARTBEAT_SECONDS = 10.0
_MAX_MESSAGE_BYTES = 1024


class Health(enum.IntEnum):
    UNKNOWN = health_pb2.UNKNOWN
    HEALTHY = health_pb2.HEALTHY
    UNHEALTHY = health_pb2.UNHEALTHY


class DeviceHealthReport(msgspec.Struct, frozen=True, kw_only=True):
    """The health of one device; ``updated_at`` in unix seconds."""

    pool: str
    device: str
    health: Health
    updated_at: int
    message: str = ""


class HealthSource(Protocol):
    """Where device health comes from (the bus once the health monitor publishes it)."""

    def snapshot(self) -> tuple[DeviceHealthReport, ...]:
        """The current health of every device of the node."""
        ...

    async def wait_changed(self) -> None:
        """Return on the next change."""
        ...


class StaticHealth:
    """A health source held in memory: every device healthy until :meth:`update` says not."""

    def __init__(self, *, pool: str, devices: Iterable[str]) -> None:
        now = int(time.time())
        self._reports = {
            d: DeviceHealthReport(pool=pool, device=d, health=Health.HEALTHY, updated_at=now)
            for d in devices
        }
        self._changed = asyncio.Event()

    def snapshot(self) -> tuple[DeviceHealthReport, ...]:
        return tuple(self._reports.values())

    def update(self, report: DeviceHealthReport) -> None:
        self._reports[report.device] = report
        # Wake every waiting stream, then re-arm for the next change.
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_changed(self) -> None:
        await self._changed.wait()


def _truncate(message: str) -> str:
    data = message.encode()
    if len(data) <= _MAX_MESSAGE_BYTES:
        return message
    return data[:_MAX_MESSAGE_BYTES].decode(errors="ignore")


def to_response(
    reports: Iterable[DeviceHealthReport], *, timeout_seconds: int
) -> health_pb2.NodeWatchResourcesResponse:
    return health_pb2.NodeWatchResourcesResponse(
        devices=[
            health_pb2.DeviceHealth(
                device=health_pb2.DeviceIdentifier(pool_name=r.pool, device_name=r.device),
                health=health_pb2.HealthStatus.ValueType(int(r.health)),
                last_updated_time=r.updated_at,
                health_check_timeout_seconds=timeout_seconds,
                message=_truncate(r.message),
            )
            for r in reports
        ]
    )


class HealthServicer(health_pb2_grpc.DRAResourceHealthServicer):
    """``v1alpha1.DRAResourceHealth/NodeWatchResources``."""

    def __init__(
        self,
        source: HealthSource,
        *,
        heartbeat_seconds: float = DEFAULT_HEARTBEAT_SECONDS,
        timeout_seconds: int = 30,
    ) -> None:
        self._source = source
        self._heartbeat = heartbeat_seconds
        self._timeout = timeout_seconds

    async def NodeWatchResources(
        self,
        request: health_pb2.NodeWatchResourcesRequest,
        context: grpc.aio.ServicerContext[
            health_pb2.NodeWatchResourcesRequest, health_pb2.NodeWatchResourcesResponse
        ],
    ) -> AsyncIterator[health_pb2.NodeWatchResourcesResponse]:
        while True:
            yield to_response(self._source.snapshot(), timeout_seconds=self._timeout)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._heartbeat):
                    await self._source.wait_changed()


def health_service(servicer: HealthServicer) -> Servable:
    """``servicer`` as a server registers it."""
    return Servable(health_pb2_grpc.add_DRAResourceHealthServicer_to_server, servicer)
