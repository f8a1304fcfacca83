"""The one small HTTP server of a service: /metrics, /healthz, /readyz."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

__all__ = ["HealthServer"]

Check = Callable[[], bool]
#: A JSON endpoint: the request body in, the status and the JSON body out.
JsonHandler = Callable[[bytes], Awaitable[tuple[int, bytes]]]

_MAX_BODY = 128 * 2**20


class HealthServer:
    """Serves Prometheus metrics and the kubelet's probes.

    ``/healthz`` answers 200 while every liveness check passes (the process is not wedged);
    ``/readyz`` answers 200 once every readiness check passes, 503 with the failing names
    otherwise.
    """

    def __init__(
        self,
        *,
        host: str,
        port: int,
        registry: CollectorRegistry = REGISTRY,
    ) -> None:
        self._host, self._port = host, port
        self._registry = registry
        self._live: dict[str, Check] = {}
        self._ready: dict[str, Check] = {}
        self._runner: web.AppRunner | None = None
        self._posts: dict[str, JsonHandler] = {}
        self.port = port

    def add_liveness(self, name: str, check: Check) -> None:
        self._live[name] = check

    def add_readiness(self, name: str, check: Check) -> None:
        self._ready[name] = check

    def add_json_post(self, path: str, handler: JsonHandler) -> None:
        """Serve ``POST path`` with ``handler`` (a service's own API beside the probes, such
        as the scheduler extender's verbs); add before :meth:`start`."""
        if path in self._posts or path in ("/metrics", "/healthz", "/readyz"):
            raise ValueError(f"HTTP server: {path} is served twice")
        self._posts[path] = handler

    @staticmethod
    def _json_endpoint(handler: JsonHandler) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def endpoint(request: web.Request) -> web.Response:
            status, body = await handler(await request.read())
            return web.Response(status=status, body=body, content_type="application/json")

        return endpoint

    @staticmethod
    def _verdict(checks: dict[str, Check]) -> web.Response:
        failing = sorted(name for name, check in checks.items() if not check())
        if failing:
            return web.json_response({"status": "failing", "failing": failing}, status=503)
        return web.json_response({"status": "ok"})

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self._registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, request: web.Request) -> web.Response:
        return self._verdict(self._live)

    async def _readyz(self, request: web.Request) -> web.Response:
        return self._verdict(self._ready)

    async def start(self) -> None:
        # A scheduler extender without a node cache is sent every candidate Node in full:
        # megabytes on a large cluster, past aiohttp's 1 MiB default.
        app = web.Application(client_max_size=_MAX_BODY)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        for path, handler in self._posts.items():
            app.router.add_post(path, self._json_endpoint(handler))
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        # With port 0 the OS picked one; report the real port.
        addresses = self._runner.addresses
        if addresses:
            self.port = int(addresses[0][1])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
