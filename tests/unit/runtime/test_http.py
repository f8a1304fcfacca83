"""The probe server answers /healthz, /readyz and /metrics from the checks it was given."""

from __future__ import annotations

import aiohttp
from neuron_dra_common.runtime import HealthServer


async def test_probes_follow_their_checks() -> None:
    ready = False
    server = HealthServer(host="127.0.0.1", port=0)
    server.add_liveness("loop", lambda: True)
    server.add_readiness("nats", lambda: ready)
    await server.start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/readyz") as resp:
                assert resp.status == 503
                assert await resp.json() == {"status": "failing", "failing": ["nats"]}
            ready = True
            async with http.get(f"{base}/readyz") as resp:
                assert resp.status == 200
            async with http.get(f"{base}/healthz") as resp:
                assert resp.status == 200
            async with http.get(f"{base}/metrics") as resp:
                assert resp.status == 200
                assert "python_info" in await resp.text()
    finally:
        await server.stop()
