"""gRPC plumbing: ``grpc.aio`` servers on unix sockets, with trace context from metadata.

The only module of the common library that touches gRPC servers. A service hands its
servicers (grpcio servicers from ``neuron_dra_protos``, each with the generated
``add_*Servicer_to_server`` that registers it) to a server that:

- binds its socket with an explicit mode (:data:`SOCKET_MODE` unless told otherwise), and
  never has it reachable at a wider one (see :func:`_bind_private`);
- replaces a stale socket left by an earlier process (a live listener at the path is never a
  reason to fail over: the kubelet only talks to the newest socket);
- refuses to replace anything at the path that is not a socket;
- removes its own socket on exit, but only if the path still is the socket it created;
- lets unary calls under way finish (for a grace period) before it stops, ends streams, and
  closes every connection it accepted;
- refuses a request that is no protobuf of the method's message with ``INVALID_ARGUMENT``,
  naming the message type (and logs no traceback for it);
- refuses a message larger than its limit with ``RESOURCE_EXHAUSTED`` (see
  :data:`MAX_RECEIVE_BYTES`);
- joins the caller's trace: the W3C ``traceparent`` in the request metadata becomes the
  parent of a server span named after the method (with tracing off, just the current
  context of the call, so what the handler sends on carries it).

grpcio's C core starts threads and does not survive a ``fork``: nothing here makes a gRPC
object before :meth:`UnixGrpcServer.start` (or :func:`unix_channel`) runs in the service's
event loop, so a launcher may import this module and fork node agents afterwards.

Example::

    async with UnixGrpcServer(path, services=[Servable(add_FooServicer_to_server, Foo())]):
        await stopped.wait()
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import shutil
import stat
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import grpc
from google.protobuf.message import DecodeError
from opentelemetry import context as otel_context
from opentelemetry import trace

from neuron_dra_common.telemetry import extract_grpc_metadata, get_tracer, tracing_enabled

__all__ = [
    "MAX_RECEIVE_BYTES",
    "MAX_SEND_BYTES",
    "MAX_UNIX_PATH",
    "SOCKET_MODE",
    "Servable",
    "SocketPathError",
    "UnixGrpcServer",
    "channel_options",
    "remove_stale_socket",
    "unix_channel",
    "unix_target",
]

#: Longest socket path the kernel accepts (``sun_path`` is 108 bytes with the final NUL).
MAX_UNIX_PATH: Final = 107

#: The kubelet sends one pod's claims per DRA call (a pod has at most a few dozen, each three
#: names of at most 253 bytes: well under 64 KiB) and small device-plugin and registration
#: requests. 4 MiB is gRPC-Go's own default on the kubelet's side of these sockets, so a
#: peer that keeps to its defaults is never refused, and anything larger is no kubelet's
#: request: it is refused with RESOURCE_EXHAUSTED before it is decoded.
MAX_RECEIVE_BYTES: Final = 4 * 1024 * 1024
#: The kubelet's gRPC-Go client refuses an answer above its 4 MiB receive limit: sending one
#: would only fail there, so it fails here, where the error names the method.
MAX_SEND_BYTES: Final = 4 * 1024 * 1024

#: Owner read/write only. The kubelet runs as root and connects whatever the mode; nobody
#: else on the node has reason to call the plugin (a unix socket is dialled by writing to
#: it, so this also keeps every other user out). The Go plugins' helper binds under the
#: process umask, usually 0o755 (the same: only the owner, or root, can connect); here it
#: is explicit. A kubelet run as a non-root user in the plugin's group needs ``0o660``:
#: pass ``mode``.
SOCKET_MODE: Final = 0o600

#: Name of the socket inside the private directory it is bound in: short, so the path
#: fits the kernel's limit wherever the final one does (up to a few bytes, checked).
_STAGED = "s"


def _options(*, receive: int, send: int) -> list[tuple[str, Any]]:
    return [
        ("grpc.max_receive_message_length", receive),
        ("grpc.max_send_message_length", send),
    ]


def channel_options() -> list[tuple[str, Any]]:
    """Options of a channel to the kubelet: the same message limits as our servers."""
    return _options(receive=MAX_RECEIVE_BYTES, send=MAX_SEND_BYTES)


def unix_channel(path: Path) -> grpc.aio.Channel:
    """A ``grpc.aio`` channel to the unix socket at ``path``, with :func:`channel_options`.

    Make it inside the running event loop (never at import: see the module's note on fork).
    """
    return grpc.aio.insecure_channel(unix_target(path), options=channel_options())


@dataclass(frozen=True)
class Servable:
    """A grpcio servicer and the generated function that registers it on a server.

    >>> from neuron_dra_protos.registration.v1 import registration_pb2_grpc as pb_grpc
    >>> s = Servable(pb_grpc.add_RegistrationServicer_to_server, pb_grpc.RegistrationServicer())
    """

    add: Callable[[Any, grpc.aio.Server], None]
    servicer: object


class SocketPathError(OSError):
    """A socket path cannot be used: too long, not absolute, or taken by something else."""


def unix_target(path: Path) -> str:
    """The gRPC target of a unix socket path (``unix:///abs/path``)."""
    return f"unix://{path}"


def _staging_length(path: Path) -> int:
    # <parent>/.<8 random characters>/s, as tempfile.mkdtemp(prefix=".") names it.
    return len(os.fsencode(path.parent)) + 1 + 9 + 1 + len(_STAGED)


def _check_path(path: Path) -> None:
    if not path.is_absolute():
        raise SocketPathError(f"socket path {path}: not absolute")
    length = max(len(os.fsencode(path)), _staging_length(path))
    if length > MAX_UNIX_PATH:
        raise SocketPathError(
            f"socket path {path}: {length} bytes (with the directory it is bound in first), "
            f"longer than the {MAX_UNIX_PATH} a unix socket allows"
        )


def remove_stale_socket(path: Path) -> bool:
    """Remove a socket left at ``path``; ``True`` if one was there.

    Anything else at the path (a file, a directory) is not ours to delete and raises
    :class:`SocketPathError`.
    """
    if not _is_socket_or_missing(path):
        raise SocketPathError(f"socket path {path}: exists and is not a socket")
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def _is_socket_or_missing(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(path.lstat().st_mode)
    except FileNotFoundError:
        return True


class _Unparsable:
    """What the lenient deserializer hands on instead of raising: the handler refuses it."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message


def _lenient(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserialize is None:
        return None

    def lenient(data: bytes) -> Any:
        try:
            return deserialize(data)
        except DecodeError as exc:
            # protobuf's text names the type: "Error parsing message with type '...'".
            return _Unparsable(str(exc) or "Error parsing message")

    return lenient


#: The context of a call that carries no trace (reusable: it does nothing).
_UNTRACED: Final = contextlib.nullcontext()


@contextlib.contextmanager
def _attached(ctx: otel_context.Context) -> Iterator[None]:
    token = otel_context.attach(ctx)
    try:
        yield
    finally:
        otel_context.detach(token)


async def _run_until(ending: asyncio.Event, work: Awaitable[Any]) -> None:
    """``work`` until it ends or ``ending`` is set (then it is cancelled)."""
    task = asyncio.ensure_future(work)
    waiter = asyncio.ensure_future(ending.wait())
    try:
        await asyncio.wait((task, waiter), return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if not task.cancelled():
        task.result()  # its error, if it failed


async def _until(ending: asyncio.Event, responses: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """The items of ``responses`` until it ends or ``ending`` is set (streams are rare and
    slow: a task per item costs nothing that matters)."""
    try:
        while not ending.is_set():
            step: asyncio.Future[Any] = asyncio.ensure_future(anext(responses))
            waiter = asyncio.ensure_future(ending.wait())
            try:
                await asyncio.wait((step, waiter), return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
                if not step.done():
                    step.cancel()
                    with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                        await step
            if step.cancelled():
                return
            try:
                item = step.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        aclose = getattr(responses, "aclose", None)
        if aclose is not None:
            await aclose()


class _Calls(grpc.aio.ServerInterceptor):
    """Runs every method in the caller's trace, refuses unparsable requests and ends the
    streams when the server stops.

    The wrapped handler of each method is made once, on its first call, and kept.
    """

    def __init__(self, *, tracer: trace.Tracer, always: bool) -> None:
        self._tracer = tracer
        self._always = always
        self._handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
        #: Set when the server stops: every stream ends (its handler is cancelled and the
        #: call finishes with OK), while unary calls get the grace.
        self.ending = asyncio.Event()

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        method = handler_call_details.method
        handler = self._handlers.get(method)
        if handler is None:
            inner = await continuation(handler_call_details)
            if inner is None:
                return None  # UNIMPLEMENTED, as grpc answers it
            handler = self._handlers[method] = self._wrap(method, inner)
        return handler

    def _traced(
        self, method: str, context: grpc.aio.ServicerContext[Any, Any]
    ) -> contextlib.AbstractContextManager[Any]:
        if not self._always and not tracing_enabled():
            # Nothing is recorded: only a caller's trace context is carried on (to the
            # events and API calls the handler makes); a caller that sends none costs
            # nothing more.
            metadata = context.invocation_metadata()
            for key, _ in metadata or ():
                if key == "traceparent":
                    return _attached(extract_grpc_metadata(list(metadata or ())))
            return _UNTRACED
        return self._tracer.start_as_current_span(
            method,
            context=extract_grpc_metadata(list(context.invocation_metadata() or ())),
            kind=trace.SpanKind.SERVER,
        )

    def _wrap(
        self, method: str, inner: grpc.RpcMethodHandler[Any, Any]
    ) -> grpc.RpcMethodHandler[Any, Any]:
        deserialize = _lenient(inner.request_deserializer)
        serialize = inner.response_serializer
        if inner.unary_unary is not None:
            # grpc's stubs type the behaviours as blocking ones; these are coroutines.
            unary: Any = inner.unary_unary

            async def unary_unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                if isinstance(request, _Unparsable):
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
                with self._traced(method, context):
                    return await unary(request, context)

            return grpc.unary_unary_rpc_method_handler(
                unary_unary, request_deserializer=deserialize, response_serializer=serialize
            )
        if inner.unary_stream is not None:
            stream: Any = inner.unary_stream
            if inspect.isasyncgenfunction(stream):

                async def unary_stream_gen(
                    request: Any, context: grpc.aio.ServicerContext[Any, Any]
                ) -> AsyncIterator[Any]:
                    if isinstance(request, _Unparsable):
                        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
                    with self._traced(method, context):
                        async for response in _until(self.ending, stream(request, context)):
                            yield response

                return grpc.unary_stream_rpc_method_handler(
                    unary_stream_gen,
                    request_deserializer=deserialize,
                    response_serializer=serialize,
                )

            async def unary_stream(
                request: Any, context: grpc.aio.ServicerContext[Any, Any]
            ) -> Any:
                if isinstance(request, _Unparsable):
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
                with self._traced(method, context):
                    await _run_until(self.ending, stream(request, context))

            return grpc.unary_stream_rpc_method_handler(
                unary_stream, request_deserializer=deserialize, response_serializer=serialize
            )
        # Client streams: none of the kubelet's services has one; served as they are.
        return inner


def _bind_private(server: grpc.aio.Server, path: Path, *, mode: int) -> Path:
    """Bind ``server`` to a socket in a fresh directory next to ``path`` and set its mode.

    Race-free: ``mkdtemp`` makes the directory 0o700, so until the socket has its mode nobody
    else can reach it; it is then renamed into place (which also replaces a stale socket in
    one step). The process umask, shared with every other thread, is never touched. The
    staged path is returned: the caller renames it (after ``start``) and removes its
    directory. The kubelet's plugin watcher sees the rename as a new file, and ignores the
    dot directory.

    grpc unlinks the path it bound when the server stops. Here that is the staged path,
    gone by then, so a stopping server can never delete the socket a successor has bound
    at the real path in the meantime (a rolling restart); ours is removed by
    :meth:`UnixGrpcServer.stop`, and only if it still is ours.
    """
    staging = Path(tempfile.mkdtemp(prefix=".", dir=path.parent))
    staged = staging / _STAGED
    try:
        if not server.add_insecure_port(unix_target(staged)):
            raise SocketPathError(f"socket path {path}: could not bind it")
        os.chmod(staged, mode)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return staged


class UnixGrpcServer:
    """A ``grpc.aio`` server bound to one unix socket, usable as an async context manager.

    ``tracer``: record server spans with this tracer whatever the process's tracing says
    (the process-wide tracer records only once tracing is on). ``mode``: the socket file's
    permission bits. ``max_receive_bytes``/``max_send_bytes``: message limits (a larger
    request is refused with ``RESOURCE_EXHAUSTED``).
    """

    def __init__(
        self,
        path: Path,
        *,
        services: Sequence[Servable],
        grace_seconds: float = 1.0,
        tracer: trace.Tracer | None = None,
        mode: int = SOCKET_MODE,
        max_receive_bytes: int = MAX_RECEIVE_BYTES,
        max_send_bytes: int = MAX_SEND_BYTES,
    ) -> None:
        _check_path(path)
        self.path = path
        self._services = tuple(services)
        self._grace = grace_seconds
        self._always = tracer is not None
        self._tracer = tracer
        self._mode = mode
        self._limits = (max_receive_bytes, max_send_bytes)
        self._server: grpc.aio.Server | None = None
        self._calls: _Calls | None = None
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
        if not _is_socket_or_missing(self.path):
            raise SocketPathError(f"socket path {self.path}: exists and is not a socket")
        calls = _Calls(tracer=self._tracer or get_tracer(), always=self._always)
        receive, send = self._limits
        server = grpc.aio.server(interceptors=[calls], options=_options(receive=receive, send=send))
        for service in self._services:
            service.add(service.servicer, server)
        try:
            staged = _bind_private(server, self.path, mode=self._mode)
        except (OSError, RuntimeError) as exc:
            raise SocketPathError(f"socket path {self.path}: could not bind it: {exc}") from exc
        try:
            await server.start()
            os.rename(staged, self.path)
        except BaseException:
            await server.stop(None)
            raise
        finally:
            shutil.rmtree(staged.parent, ignore_errors=True)
        self._server, self._calls = server, calls
        self._inode = self.path.lstat().st_ino

    async def stop(self) -> None:
        """Stop serving (unary calls under way get the grace period; streams end), close
        every connection and remove the socket."""
        server, self._server = self._server, None
        calls, self._calls = self._calls, None
        if server is not None and calls is not None:
            # Streams never end by themselves (a health watch runs for as long as the
            # kubelet): they end now. New calls are refused from here on; unary calls
            # under way get the grace, then are cancelled, and every connection closes.
            calls.ending.set()
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
