"""The ``slices`` scenario's baseline: kubernetes-asyncio's bare write loop.

Run by ``bench/scenarios/slices.py`` in a child process of the bench's own environment
(``bench/baseline_env.py``), so that its CPU time is its own; it imports nothing of the bench
or of neuron-dra, only kubernetes-asyncio, as a program on the library alone would.

Reads one JSON object on standard input::

    {"kubeconfig": "...", "path": "/apis/resource.k8s.io/v1/resourceslices",
     "workers": 16, "change_gap": 0.05,
     "pools": [[slice, ...], ...],   # each node's slices, created in order, `workers` nodes at once
     "changes": [slice, ...],        # one replace each, of a slice the loop created
     "servers": {"kube-apiserver": pid, ...}}

and prints one::

    {"seconds": ..., "own": ..., "cpu_before": {...}, "cpu_after": {...}, "changes": [...]}

``seconds`` is the wall time of the loop, ``own`` this process's CPU time in it, ``cpu_before``
and ``cpu_after`` the CPU seconds each server had used when it started and ended, and
``changes`` the duration of each replace: its PUT only, after the same quiet gap
(``change_gap``) the publisher's changes start after; the slice's resourceVersion is read
before the gap.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """User + system CPU seconds each process has used so far (0 once it is gone)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for name, pid in pids.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            out[name] = 0.0
            continue
        out[name] = (int(fields[11]) + int(fields[12])) / tick
    return out


async def bounded(n: int, workers: int, work: Callable[[int], Awaitable[None]]) -> None:
    sem = asyncio.Semaphore(workers)

    async def one(i: int) -> None:
        async with sem:
            await work(i)

    await asyncio.gather(*(one(i) for i in range(n)))


async def measure(spec: dict[str, Any]) -> dict[str, Any]:
    configuration = k8s.Configuration()
    await k8s_config.load_kube_config(
        config_file=spec["kubeconfig"], client_configuration=configuration
    )
    bare = k8s.ApiClient(configuration)

    async def call(method: str, path: str, body: Any = None) -> Any:
        return await bare.call_api(
            path,
            method,
            query_params=[],
            header_params={"Content-Type": "application/json", "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
            response_types_map={200: "object", 201: "object"},
            _return_http_data_only=True,
        )

    path: str = spec["path"]
    workers: int = spec["workers"]
    pools: list[list[dict[str, Any]]] = spec["pools"]
    servers: dict[str, int] = spec["servers"]

    async def write(i: int) -> None:
        for body in pools[i]:
            await call("POST", path, body)

    async def connect(i: int) -> None:
        await call("GET", "/version")

    try:
        # As many connections as writers, open before the clock starts, as a client that
        # has been talking to the apiserver has them.
        await bounded(workers, workers, connect)
        cpu0, own0 = cpu_seconds(servers), time.process_time()
        t0 = time.perf_counter()
        await bounded(len(pools), workers, write)
        seconds = time.perf_counter() - t0
        cpu1, own = cpu_seconds(servers), time.process_time() - own0
        changes: list[float] = []
        for body in spec["changes"]:
            current = await call("GET", f"{path}/{body['metadata']['name']}")
            body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            await asyncio.sleep(spec["change_gap"])
            t = time.perf_counter()
            await call("PUT", f"{path}/{body['metadata']['name']}", body)
            changes.append(time.perf_counter() - t)
    finally:
        await bare.close()
    return {
        "seconds": seconds,
        "own": own,
        "cpu_before": cpu0,
        "cpu_after": cpu1,
        "changes": changes,
    }


if __name__ == "__main__":
    result = asyncio.run(measure(json.load(sys.stdin)))
    json.dump(result, sys.stdout)
