"""Registration with the kubelet's device manager, and the plugin's sockets around it.

For each resource the plugin serves ``DevicePlugin`` on its own socket in
``<kubelet-root>/device-plugins/`` and calls ``Registration.Register`` on ``kubelet.sock``
there, naming the socket by its file name. A kubelet that restarts empties that directory and
makes a new ``kubelet.sock``: the plugin notices the new socket (another inode), serves its
sockets anew and registers again, so the node's capacity comes back without a plugin restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Final

import grpc
from neuron_dra_common.grpcserver import UnixGrpcServer, unix_channel
from neuron_dra_protos.deviceplugin.v1beta1 import deviceplugin_pb2 as pb
from neuron_dra_protos.deviceplugin.v1beta1 import deviceplugin_pb2_grpc as pb_grpc

from neuron_dra_device_plugin.servicer import (
    OPTIONS,
    DevicePluginServicer,
    device_plugin_service,
)

__all__ = ["API_VERSION", "KUBELET_SOCKET", "Registrar", "kubelet_socket_probe", "socket_name"]

log = logging.getLogger(__name__)

API_VERSION: Final = "v1beta1"
KUBELET_SOCKET: Final = "kubelet.sock"
_REGISTER_TIMEOUT = 10.0
#: How long a liveness probe waits for the kubelet's socket to answer.
_PROBE_TIMEOUT = 0.5
#: A method the kubelet's registration server does not have: it answers UNIMPLEMENTED, which
#: takes its gRPC server to be up and serving (a socket file alone can outlive the kubelet).
_PROBE_METHOD: Final = "/v1beta1.Registration/Probe"
#: What a call that reached the kubelet's gRPC server may still fail with: anything else
#: (UNAVAILABLE, DEADLINE_EXCEEDED, a cut connection) means nothing answered.
_ANSWERED: Final = frozenset({grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.OK})
_RETRY_SECONDS = 5.0


def socket_name(resource: str) -> str:
    """The plugin's socket file for ``resource``.

    >>> socket_name("aws.amazon.com/neuroncore")
    'neuron-dra-neuroncore.sock'
    """
    return f"neuron-dra-{resource.rsplit('/', 1)[-1]}.sock"


_Identity = tuple[int, int, int]


def _identity(path: Path) -> _Identity | None:
    """Which file is at ``path``: a socket made anew may reuse the inode number of the one it
    replaces, so its change time tells them apart too."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def kubelet_socket_probe(kubelet_socket: Path) -> Callable[[], Awaitable[bool]]:
    """Whether the kubelet serves on ``kubelet_socket``: the plugin's sign that its node's
    kubelet is alive, with no network to the node needed (a kubelet that died leaves its
    socket file, but nothing answers on it). Each probe is a gRPC call the kubelet answers
    with UNIMPLEMENTED. One connection is kept for all the probes while the kubelet lives, so
    a probe every second opens none; once it breaks, the next probe dials anew, so a
    restarted kubelet is seen at its next probe (a channel kept would wait out gRPC's
    reconnection backoff instead). The channel is made on the first probe, in the running
    loop."""
    channel: grpc.aio.Channel | None = None

    async def probe() -> bool:
        nonlocal channel
        if channel is None:
            channel = unix_channel(kubelet_socket)
        call = channel.unary_unary(
            _PROBE_METHOD,
            request_serializer=pb.Empty.SerializeToString,
            response_deserializer=pb.Empty.FromString,
        )
        try:
            await call(pb.Empty(), timeout=_PROBE_TIMEOUT)
        except grpc.aio.AioRpcError as exc:
            if exc.code() in _ANSWERED:
                return True  # its gRPC server answered, that it has no such method
            await channel.close()
            channel = None
            return False
        return True

    return probe


async def register(kubelet_socket: Path, *, resource: str, endpoint: str) -> None:
    """One ``Register`` call; raises ``grpc.aio.AioRpcError`` when the kubelet refuses or
    nothing answers (``UNAVAILABLE``, ``DEADLINE_EXCEEDED``)."""
    async with unix_channel(kubelet_socket) as channel:
        stub = pb_grpc.RegistrationStub(channel)
        await stub.Register(
            pb.RegisterRequest(
                version=API_VERSION, endpoint=endpoint, resource_name=resource, options=OPTIONS
            ),
            timeout=_REGISTER_TIMEOUT,
        )


class Registrar:
    """Serves the resources' sockets and keeps them registered while :meth:`run` runs."""

    def __init__(
        self,
        directory: Path,
        *,
        servicers: Sequence[DevicePluginServicer],
        interval: float = 1.0,
    ) -> None:
        self._dir = directory.absolute()
        self._servicers = tuple(servicers)
        self._interval = interval
        self._stop = asyncio.Event()
        #: Registrations accepted by the current kubelet; 0 while none or after it left.
        self.registered = 0
        self.registrations = 0

    @property
    def kubelet_socket(self) -> Path:
        return self._dir / KUBELET_SOCKET

    def stop(self) -> None:
        self._stop.set()

    async def _sleep(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), timeout=self._interval)

    async def _wait_for_new(self, kubelet: _Identity, *, within: float) -> None:
        """Return once the kubelet's socket is another one, after ``within`` s, or on stop."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while not self._stop.is_set() and loop.time() < deadline:
            await self._sleep()
            if _identity(self.kubelet_socket) != kubelet:
                return

    async def run(self) -> None:
        """Until :meth:`stop`: wait for the kubelet, serve, register, and start over whenever
        its socket is made anew or one of ours disappears."""
        while not self._stop.is_set():
            kubelet = _identity(self.kubelet_socket)
            if kubelet is None:
                await self._sleep()
                continue
            await self._serve_while(kubelet)

    async def _serve_while(self, kubelet: _Identity) -> None:
        servers = [
            UnixGrpcServer(self._dir / socket_name(s.resource), services=[device_plugin_service(s)])
            for s in self._servicers
        ]
        async with contextlib.AsyncExitStack() as stack:
            for server in servers:
                await stack.enter_async_context(server)
            try:
                for s in self._servicers:
                    await register(
                        self.kubelet_socket, resource=s.resource, endpoint=socket_name(s.resource)
                    )
                    self.registrations += 1
                    log.info("registered with the kubelet", extra={"resource": s.resource})
            except grpc.aio.AioRpcError as exc:
                # A socket left by a kubelet that is gone answers nothing: wait for the next
                # kubelet's socket (or a while) rather than serving anew every interval.
                log.warning(
                    "kubelet registration failed; retrying",
                    extra={"error": exc.details() or "", "code": exc.code().name},
                )
                await self._wait_for_new(kubelet, within=_RETRY_SECONDS)
                return
            self.registered = len(self._servicers)
            try:
                while not self._stop.is_set():
                    await self._sleep()
                    if _identity(self.kubelet_socket) != kubelet:
                        log.info("the kubelet's socket is new: registering again")
                        return
                    gone = [
                        s
                        for s in self._servicers
                        if not (self._dir / socket_name(s.resource)).exists()
                    ]
                    if gone:
                        log.info("our socket was removed: serving and registering again")
                        return
            finally:
                self.registered = 0
