"""gRPC plumbing: ``grpc.aio`` servers on unix sockets, with trace context from metadata.

The only module of the common library that touches gRPC servers. A service describes what
to serve with *registrars* (``add_XServicer_to_server`` bound to its servicer) and gets a
server that:

- removes a stale socket left by an earlier process before binding (a live listener at
  the path is never a reason to fail over: the kubelet only talks to the newest socket);
- refuses to replace anything at the path that is not a socket;
- removes its own socket on exit, but only if the path still is the socket it created;
- joins the caller's trace: the W3C ``traceparent`` in the invocation metadata becomes the
  parent of a server span named after the method (with tracing off, just the current
  context of the call, so what the handler sends on carries it).

Example::

    async with UnixGrpcServer(path, registrars=[partial(add_FooServicer_to_server, foo)]):
        await stopped.wait()
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace

from neuron_dra_common.telemetry import extract_grpc_metadata, get_tracer, tracing_enabled

__all__ = [
    "MAX_UNIX_PATH",
    "Registrar",
    "SocketPathError",
    "TraceContextInterceptor",
    "UnixGrpcServer",
    "remove_stale_socket",
    "unix_target",
]

#: Longest socket path the kernel accepts (``sun_path`` is 108 bytes with the final NUL).
MAX_UNIX_PATH = 107

Registrar = Callable[[grpc.aio.Server], None]


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


# Handlers registered on an aio server are coroutine (or async generator) functions, whatever
# the sync-flavoured annotation of RpcMethodHandler says.
_Behaviour = Callable[[Any, Any], Any]


def _with_context(parent: otel_context.Context, behaviour: _Behaviour) -> _Behaviour:
    async def call(request: Any, context: Any) -> Any:
        token = otel_context.attach(parent)
        try:
            return await behaviour(request, context)
        finally:
            otel_context.detach(token)

    return call


class TraceContextInterceptor(grpc.aio.ServerInterceptor):
    """Runs each call inside a server span whose parent is the caller's trace context."""

    def __init__(self, tracer: trace.Tracer | None = None) -> None:
        # A tracer handed in always records; the process-wide one only once tracing is on.
        self._always = tracer is not None
        self._tracer = tracer or get_tracer()

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming:
            # Client-streaming calls are not part of any service served here.
            return handler
        method = handler_call_details.method
        metadata = tuple(handler_call_details.invocation_metadata or ())
        if not self._always and not tracing_enabled():
            # Nothing is recorded: only a caller's trace context is carried on (to the events
            # and API calls the handler makes); a caller that sends none costs nothing.
            if not any(key == "traceparent" for key, _ in metadata):
                return handler
            if handler.unary_unary is not None:
                return grpc.unary_unary_rpc_method_handler(
                    _with_context(extract_grpc_metadata(metadata), handler.unary_unary),
                    request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer,
                )
            return handler
        parent = extract_grpc_metadata(metadata)
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._wrap_unary(method, parent, handler.unary_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._wrap_stream(method, parent, handler.unary_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler

    def _wrap_unary(
        self, method: str, parent: otel_context.Context, behaviour: _Behaviour
    ) -> _Behaviour:
        async def call(request: Any, context: Any) -> Any:
            with self._tracer.start_as_current_span(
                method, context=parent, kind=trace.SpanKind.SERVER
            ):
                return await behaviour(request, context)

        return call

    def _wrap_stream(
        self, method: str, parent: otel_context.Context, behaviour: _Behaviour
    ) -> _Behaviour:
        async def call(request: Any, context: Any) -> AsyncIterator[Any]:
            # A stream lives long and yields to the server between messages, so the span is
            # not made current (that would leak into whatever runs between two messages).
            span = self._tracer.start_span(method, context=parent, kind=trace.SpanKind.SERVER)
            try:
                async for message in behaviour(request, context):
                    yield message
            finally:
                span.end()

        return call


class UnixGrpcServer:
    """A ``grpc.aio`` server bound to one unix socket, usable as an async context manager."""

    def __init__(
        self,
        path: Path,
        *,
        registrars: Sequence[Registrar],
        grace_seconds: float = 1.0,
        interceptors: Sequence[grpc.aio.ServerInterceptor] | None = None,
    ) -> None:
        _check_path(path)
        self.path = path
        self._registrars = tuple(registrars)
        self._grace = grace_seconds
        self._interceptors = (
            tuple(interceptors) if interceptors is not None else (TraceContextInterceptor(),)
        )
        self._server: grpc.aio.Server | None = None
        self._inode: int | None = None

    @property
    def target(self) -> str:
        """What a client dials to reach this server."""
        return unix_target(self.path)

    async def start(self) -> None:
        """Bind the socket (replacing a stale one) and start serving."""
        if self._server is not None:
            raise RuntimeError(f"gRPC server on {self.path} already started")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_socket(self.path)
        server = grpc.aio.server(interceptors=self._interceptors)
        for register in self._registrars:
            register(server)
        if server.add_insecure_port(self.target) == 0:
            raise SocketPathError(f"socket path {self.path}: gRPC could not bind it")
        await server.start()
        self._server = server
        self._inode = self.path.lstat().st_ino

    async def stop(self) -> None:
        """Stop serving (in-flight calls get the grace period) and remove the socket."""
        server, self._server = self._server, None
        if server is not None:
            await server.stop(self._grace)
        self._remove_own_socket()

    def _remove_own_socket(self) -> None:
        inode, self._inode = self._inode, None
        if inode is None:
            return
        with contextlib.suppress(FileNotFoundError):
            # A successor may already have bound the same path: its socket is not ours.
            if self.path.lstat().st_ino == inode:
                self.path.unlink()

    async def wait_for_termination(self) -> None:
        """Return when the server has stopped."""
        if self._server is not None:
            await self._server.wait_for_termination()

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
