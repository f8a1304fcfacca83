"""gRPC plumbing: grpclib servers on unix sockets, with trace context from metadata.

The only module of the common library that touches gRPC servers. A service hands its
servicers (grpclib service bases from ``neuron_dra_protos``: anything with ``__mapping__``)
to a server that:

- removes a stale socket left by an earlier process before binding (a live listener at
  the path is never a reason to fail over: the kubelet only talks to the newest socket);
- refuses to replace anything at the path that is not a socket;
- removes its own socket on exit, but only if the path still is the socket it created;
- lets unary calls under way finish (for a grace period) before it stops, and then closes
  every connection it accepted (grpclib's own close leaves them to the clients);
- refuses a request that is no protobuf of the method's message with ``INVALID_ARGUMENT``,
  naming the message type (and logs no traceback for it);
- joins the caller's trace: the W3C ``traceparent`` in the request metadata becomes the
  parent of a server span named after the method (with tracing off, just the current
  context of the call, so what the handler sends on carries it).

grpclib (HTTP/2 in Python over asyncio) rather than grpcio: a node agent serves a handful of
calls a minute, and grpcio's C core and its threads cost about 9 MiB of memory per process.

Example::

    async with UnixGrpcServer(path, services=[FooServicer()]):
        await stopped.wait()
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from google.protobuf.message import DecodeError
from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server, Stream
from opentelemetry import context as otel_context
from opentelemetry import trace

from neuron_dra_common.telemetry import extract_grpc_metadata, get_tracer, tracing_enabled

__all__ = [
    "MAX_UNIX_PATH",
    "Servable",
    "SocketPathError",
    "UnixGrpcServer",
    "remove_stale_socket",
    "unix_target",
]

#: Longest socket path the kernel accepts (``sun_path`` is 108 bytes with the final NUL).
MAX_UNIX_PATH = 107


class Servable(Protocol):
    """A grpclib service: its methods by full name (what the generated bases provide)."""

    def __mapping__(self) -> Mapping[str, Handler]: ...


class SocketPathError(OSError):
    """A socket path cannot be used: too long, not absolute, or taken by something else."""


def unix_target(path: Path) -> str:
    """The gRPC target of a unix socket path (``unix:///abs/path``)."""
    return f"unix://{path}"


def _check_path(path: Path) -> None:
    if not path.is_absolute():
        raise SocketPathError(f"socket path {path}: not absolute")
    if len(os.fsencode(path)) > MAX_UNIX_PATH:
        raise SocketPathError(
            f"socket path {path}: {len(os.fsencode(path))} bytes, longer than the "
            f"{MAX_UNIX_PATH} a unix socket allows"
        )


def remove_stale_socket(path: Path) -> bool:
    """Remove a socket left at ``path``; ``True`` if one was there.

    Anything else at the path (a file, a directory) is not ours to delete and raises
    :class:`SocketPathError`.
    """
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return False
    if not stat.S_ISSOCK(mode):
        raise SocketPathError(f"socket path {path}: exists and is not a socket")
    path.unlink()
    return True


def _accepted(path: Path) -> list[int]:
    """This process's descriptors of connections accepted on the unix socket at ``path``.

    The kernel lists every unix socket in ``/proc/net/unix``; an accepted connection carries
    its listener's path and is connected (state 03).
    """
    inodes: set[str] = set()
    try:
        with open("/proc/net/unix") as table:
            next(table)
            for line in table:
                fields = line.split(None, 7)
                if len(fields) == 8 and fields[5] == "03" and fields[7].rstrip("\n") == str(path):
                    inodes.add(fields[6])
    except OSError:
        return []
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:[") and target[8:-1] in inodes:
                found.append(int(fd))
    return found


def _shut_down(fd: int) -> None:
    """End a connection at the socket layer; its transport sees the end and closes."""
    sock = socket.socket(fileno=fd)
    try:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    finally:
        sock.detach()  # the descriptor stays the transport's to close


_Call = Callable[[Stream[Any, Any]], Awaitable[None]]
_Wrap = Callable[[str, _Call, Cardinality], _Call]


class _Wrapped:
    """A service whose every method runs through ``wrap`` (given its name and cardinality)."""

    def __init__(self, service: Servable, wrap: _Wrap) -> None:
        self._service = service
        self._wrap = wrap

    def __mapping__(self) -> dict[str, Handler]:
        return {
            name: Handler(
                self._wrap(name, handler.func, handler.cardinality),
                handler.cardinality,
                handler.request_type,
                handler.reply_type,
            )
            for name, handler in self._service.__mapping__().items()
        }


class UnixGrpcServer:
    """A grpclib server bound to one unix socket, usable as an async context manager.

    ``tracer``: record server spans with this tracer whatever the process's tracing says
    (the process-wide tracer records only once tracing is on).
    """

    def __init__(
        self,
        path: Path,
        *,
        services: Sequence[Servable],
        grace_seconds: float = 1.0,
        tracer: trace.Tracer | None = None,
    ) -> None:
        _check_path(path)
        self.path = path
        self._services = tuple(services)
        self._grace = grace_seconds
        self._always = tracer is not None
        self._tracer = tracer or get_tracer()
        self._server: Server | None = None
        self._inode: int | None = None
        self._unary = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def target(self) -> str:
        """What a client dials to reach this server."""
        return unix_target(self.path)

    def _traced(self, method: str, call: _Call, cardinality: Cardinality) -> _Call:
        """``call`` in the caller's trace, counted while under way if unary."""
        unary = cardinality in (Cardinality.UNARY_UNARY, Cardinality.STREAM_UNARY)

        async def traced(stream: Stream[Any, Any]) -> None:
            try:
                await counted(stream)
            except DecodeError as exc:
                # protobuf's text names the type: "Error parsing message with type '...'".
                message = str(exc) or "Error parsing message"
                raise GRPCError(Status.INVALID_ARGUMENT, message) from exc

        async def counted(stream: Stream[Any, Any]) -> None:
            if unary:
                self._unary += 1
                self._idle.clear()
            try:
                metadata = list(stream.metadata.items()) if stream.metadata else []
                if not self._always and not tracing_enabled():
                    # Nothing is recorded: only a caller's trace context is carried on (to
                    # the events and API calls the handler makes); a caller that sends none
                    # costs nothing.
                    if not any(key == "traceparent" for key, _ in metadata):
                        await call(stream)
                        return
                    token = otel_context.attach(extract_grpc_metadata(metadata))
                    try:
                        await call(stream)
                    finally:
                        otel_context.detach(token)
                    return
                with self._tracer.start_as_current_span(
                    method, context=extract_grpc_metadata(metadata), kind=trace.SpanKind.SERVER
                ):
                    await call(stream)
            finally:
                if unary:
                    self._unary -= 1
                    if not self._unary:
                        self._idle.set()

        return traced

    async def start(self) -> None:
        """Bind the socket (replacing a stale one) and start serving."""
        if self._server is not None:
            raise RuntimeError(f"gRPC server on {self.path} already started")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_socket(self.path)
        server = Server([_Wrapped(service, self._traced) for service in self._services])
        try:
            await server.start(path=str(self.path))
        except OSError as exc:
            raise SocketPathError(f"socket path {self.path}: could not bind it: {exc}") from exc
        self._server = server
        self._inode = self.path.lstat().st_ino

    async def stop(self) -> None:
        """Stop serving (unary calls under way get the grace period; streams end), close
        every connection and remove the socket."""
        server, self._server = self._server, None
        if server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), self._grace)
            server.close()
            await server.wait_closed()
            await self._close_connections()
        self._remove_own_socket()

    async def _close_connections(self) -> None:
        # A client that keeps its connection (the kubelet does) would otherwise hold it, and
        # this process's end of it, for as long as the process lives.
        for fd in _accepted(self.path):
            _shut_down(fd)
        for _ in range(200):  # a second at most: each transport closes at its next read
            if not _accepted(self.path):
                return
            await asyncio.sleep(0.005)

    def _remove_own_socket(self) -> None:
        inode, self._inode = self._inode, None
        if inode is None:
            return
        with contextlib.suppress(FileNotFoundError):
            # A successor may already have bound the same path: its socket is not ours.
            if self.path.lstat().st_ino == inode:
                self.path.unlink()

    async def __aenter__(self) -> UnixGrpcServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
