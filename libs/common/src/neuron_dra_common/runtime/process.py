"""A service process: named tasks started in one place, probes, orderly shutdown.

>>> async def build() -> Service:
...     bus = await Bus.connect(settings.nats_servers, name="slice-publisher")
...     service = Service(name="slice-publisher", settings=settings)
...     service.add_task("inventory", runner.run, stop=runner.stop, ready=lambda: runner.ready)
...     service.on_shutdown(bus.close)
...     return service
>>> raise SystemExit(run(build, name="slice-publisher", settings=settings))
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TypeVar

import uvloop

from neuron_dra_common.errors import SetupError
from neuron_dra_common.runtime.http import HealthServer, HttpLimits
from neuron_dra_common.settings import ServiceSettings, SettingsError, env_name, load
from neuron_dra_common.telemetry.logs import configure_logging
from neuron_dra_common.telemetry.metrics import publish_build_info
from neuron_dra_common.telemetry.tracing import configure_tracing, shutdown_tracing

__all__ = ["Service", "limits_of", "run", "serve"]

log = logging.getLogger(__name__)

_SIGNALS = (signal.SIGTERM, signal.SIGINT)

S = TypeVar("S", bound=ServiceSettings)


@dataclass(frozen=True)
class _TaskSpec:
    name: str
    start: Callable[[], Awaitable[None]]
    stop: Callable[[], object] | None


def limits_of(settings: ServiceSettings) -> HttpLimits:
    """The HTTP server's limits the settings give."""
    return HttpLimits(
        header_timeout=settings.http_header_timeout,
        idle_timeout=settings.http_idle_timeout,
        request_timeout=settings.http_request_timeout,
        max_connections=settings.http_max_connections,
    )


class Service:
    """Owns a service's tasks, its HTTP server and its shutdown.

    Each task runs until shutdown; one that ends or fails before then stops the whole
    service with exit code 1, so Kubernetes restarts it rather than leaving it half alive.
    """

    def __init__(self, *, name: str, settings: ServiceSettings) -> None:
        self.name = name
        self.settings = settings
        self.http = HealthServer(
            host=settings.http_host, port=settings.http_port, limits=limits_of(settings)
        )
        self._specs: list[_TaskSpec] = []
        self._shutdown: list[Callable[[], Awaitable[object]]] = []
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._stop_requested = asyncio.Event()
        self._stopping = False
        #: A signal asked this service to stop (it must not start again by itself).
        self.stop_asked = False
        self._failed: list[str] = []
        self.http.add_liveness("tasks", lambda: not self._failed)

    def add_task(
        self,
        name: str,
        start: Callable[[], Awaitable[None]],
        *,
        stop: Callable[[], object] | None = None,
        ready: Callable[[], bool] | None = None,
    ) -> None:
        """Register a long-running task; ``stop`` asks it to finish (drain) at shutdown."""
        if any(spec.name == name for spec in self._specs):
            raise ValueError(f"service {self.name}: task {name!r} added twice")
        self._specs.append(_TaskSpec(name=name, start=start, stop=stop))
        if ready is not None:
            self.http.add_readiness(name, ready)

    def add_readiness(self, name: str, check: Callable[[], bool]) -> None:
        self.http.add_readiness(name, check)

    def on_shutdown(self, callback: Callable[[], Awaitable[object]]) -> None:
        """Run ``callback`` after the tasks stopped (close the bus, flush), in reverse order."""
        self._shutdown.append(callback)

    def request_stop(self) -> None:
        self.stop_asked = True
        self._stop_requested.set()

    def _bus_lost(self, reason: str) -> None:
        if not self._stopping:
            log.error("the bus ended a connection: stopping", extra={"lost": reason})
        self._stop_requested.set()

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if self._stopping:
            return
        if task.cancelled():
            reason = "cancelled"
        elif task.exception() is not None:
            reason = repr(task.exception())
        else:
            reason = "returned"
        log.error("task ended before shutdown", extra={"task": task.get_name(), "reason": reason})
        self._failed.append(task.get_name())
        self._stop_requested.set()

    async def run(self) -> int:
        """Start everything, wait for SIGTERM/SIGINT or a failed task, shut down in order."""
        loop = asyncio.get_running_loop()
        for sig in _SIGNALS:
            loop.add_signal_handler(sig, self._signalled, sig)
        connection = _bus_connection_module()
        if connection is not None:
            connection.on_connection_lost(self._bus_lost)
        try:
            await self.http.start()
            for spec in self._specs:
                task = asyncio.create_task(_call(spec.start), name=spec.name)
                task.add_done_callback(self._task_done)
                self._tasks[spec.name] = task
            log.info(
                "service started",
                extra={"service": self.name, "tasks": list(self._tasks), "port": self.http.port},
            )
            await self._stop_requested.wait()
            self._stopping = True
            await self._stop_all(loop.time() + self.settings.shutdown_timeout)
        finally:
            for sig in _SIGNALS:
                loop.remove_signal_handler(sig)
            if connection is not None:
                connection.on_connection_lost(None)
        code = 1 if self._failed else 0
        log.info("service stopped", extra={"service": self.name, "exit_code": code})
        return code

    def _signalled(self, sig: signal.Signals) -> None:
        log.info("shutdown requested", extra={"signal": sig.name})
        self.stop_asked = True
        self._stop_requested.set()

    async def _stop_all(self, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        for spec in self._specs:
            if spec.stop is not None:
                result = spec.stop()
                if asyncio.iscoroutine(result):
                    await result
        pending = [t for t in self._tasks.values() if not t.done()]
        if pending:
            _, late = await asyncio.wait(pending, timeout=max(0.0, deadline - loop.time()))
            for task in late:
                log.warning("task did not stop in time", extra={"task": task.get_name()})
                task.cancel()
            if late:
                await asyncio.wait(late, timeout=1.0)
        for callback in reversed(self._shutdown):
            try:
                await asyncio.wait_for(callback(), timeout=max(0.1, deadline - loop.time()))
            except Exception as exc:  # one failing step must not skip the others
                log.warning("shutdown step failed", extra={"error": repr(exc)})
        await self.http.stop()


async def _build_unless_stopped(build: Callable[[], Awaitable[Service]]) -> Service | None:
    """Run ``build`` with SIGTERM/SIGINT already handled: a stop asked for while the service
    is still wiring up (connecting to NATS or the apiserver) ends it cleanly instead of
    killing it with the default signal action. None means it was stopped before starting."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in _SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    building = asyncio.ensure_future(build())
    waiting = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({building, waiting}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiting.cancel()
        for sig in _SIGNALS:
            loop.remove_signal_handler(sig)
    if not building.done():
        building.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await building
        log.info("shutdown requested before the service started")
        return None
    service = building.result()
    if stop.is_set():
        service.request_stop()
    return service


async def _close_kube_clients() -> None:
    """Close the Kubernetes clients the service left open (a start that failed after
    connecting): otherwise aiohttp reports each unclosed session after the start error. Only
    where the process uses the API at all: importing the client costs what a service without
    it should not pay."""
    kube = sys.modules.get("neuron_dra_common.kube")
    if kube is not None:
        await kube.close_open_clients()


#: Waits before a service whose bus connection the server ended starts again (doubling).
_RESTART_FIRST_WAIT = 0.5
_RESTART_LAST_WAIT = 30.0


def _bus_connection_module() -> ModuleType | None:
    """The bus's connection module if this process loaded it (a service without the bus does
    not pay for importing the NATS client)."""
    return sys.modules.get("neuron_dra_common.bus.connection")


def _lost_bus_connections() -> list[str]:
    connection = _bus_connection_module()
    return connection.lost_connections(forget=True) if connection is not None else []


async def _call(start: Callable[[], Awaitable[None]]) -> None:
    await start()


def run(build: Callable[[], Awaitable[Service]], *, name: str, settings: ServiceSettings) -> int:
    """Set up logs and tracing, build the service on uvloop, run it, return its exit code.

    ``build`` is async because wiring usually connects to NATS or the apiserver first.
    """
    configure_logging(service=name, level=settings.log_level)
    refusal = settings.bus_refusal()
    if refusal:
        log.error(f"cannot start: {refusal}", extra={"error": refusal})
        return 2
    missing = settings.missing_bus_credentials()
    if settings.insecure_bus and missing:
        log.warning(
            f"INSECURE BUS: {env_name('insecure_bus')} is set: connecting to NATS without "
            f"{' and '.join(missing)}: whoever reaches the server may read and write every "
            "event. For debugging only",
            extra={"insecure_bus": True, "missing": missing},
        )
    configure_tracing(service=name, otlp_endpoint=settings.otlp_endpoint)
    publish_build_info(name)

    async def once() -> tuple[int, bool]:
        """The exit code, and whether to start again (a bus connection lost, no stop asked)."""
        try:
            service = await _build_unless_stopped(build)
        except SetupError as exc:
            # A kubeconfig, proxy or path the settings name that cannot be used: one line
            # that says which and why, not a traceback.
            log.error(f"cannot start: {exc}", extra={"error": str(exc)})
            return 2, False
        if service is None:
            return 0, False
        code = await service.run()
        lost = _lost_bus_connections()
        return code, bool(lost) and not service.stop_asked

    async def main() -> int:
        backoff = _RESTART_FIRST_WAIT
        try:
            while True:
                code, again = await once()
                if not again:
                    return code
                # The server ended a bus connection for good: what ran on it is gone, so the
                # service starts again in this process, as a restarted container would.
                log.warning(
                    "starting the service again: the bus ended its connection",
                    extra={"service": name, "after_seconds": backoff},
                )
                await _close_kube_clients()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _RESTART_LAST_WAIT)
        finally:
            await _close_kube_clients()
            shutdown_tracing()

    with contextlib.suppress(KeyboardInterrupt):
        return uvloop.run(main())
    return 130


def serve(
    settings_type: type[S],
    build: Callable[[S], Awaitable[Service]],
    *,
    name: str,
    prog: str,
    argv: Sequence[str] | None = None,
) -> int:
    """A service's entry point: settings from flags and environment, then :func:`run`.

    A bad setting ends the process with exit code 2 and one line naming the variable.

    >>> raise SystemExit(serve(DiscoverySettings, build, name="discovery",
    ...                        prog="neuron-dra-discovery"))
    """
    try:
        settings = load(settings_type, argv=sys.argv[1:] if argv is None else argv, prog=prog)
    except SettingsError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2

    async def wire() -> Service:
        return await build(settings)

    return run(wire, name=name, settings=settings)
