"""The probe server answers /healthz, /readyz and /metrics from the checks it was given."""

from __future__ import annotations

import io

import aiohttp
import pytest
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


async def test_a_service_adds_its_own_json_endpoints_beside_the_probes() -> None:
    server = HealthServer(host="127.0.0.1", port=0)

    async def echo(body: bytes) -> tuple[int, bytes]:
        return 200, b'{"got": %d}' % len(body)

    server.add_json_post("/filter", echo)
    await server.start()
    try:
        async with aiohttp.ClientSession() as http:
            # A scheduler without a node cache sends every candidate Node: megabytes.
            big = b"x" * (8 * 2**20)
            url = f"http://127.0.0.1:{server.port}/filter"
            async with http.post(url, data=io.BytesIO(big)) as resp:
                assert resp.status == 200
                assert resp.content_type == "application/json"
                assert await resp.json() == {"got": len(big)}
    finally:
        await server.stop()
    with pytest.raises(ValueError, match="/healthz is served twice"):
        server.add_json_post("/healthz", echo)
