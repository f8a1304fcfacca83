"""The ``ultraserver`` scenario's Kubernetes client: kubernetes-asyncio, in a process of its own.

Run by ``bench/scenarios/ultraserver.py`` in a child process of the bench's own environment
(``bench/baseline_env.py``), so that its CPU time is its own; it imports nothing of the bench
or of neuron-dra, only kubernetes-asyncio, as a program on the library alone would.

Every write and read the scenario makes, bar its watches, goes through this one client, as
when it was the bench's own: the bare variant's twin, status and template, the operator
variant's workload, the Nodes and their Leases.

Argument: the kubeconfig. Standard input: one JSON request per line::

    {"id": 1, "calls": [["POST", "/apis/...", {...}, "application/json"], ...], "uid": "..."}

The calls of a request are made one after the other; with ``uid``, each string equal to it in
the bodies of the later calls becomes the uid of the object the first call answered (the twin's
ResourceClaimTemplate is owned by the twin it has just created). Requests run concurrently, and
each is answered by one line on standard output::

    {"id": 1, "t0": 1234.5, "result": {...}}   or   {"id": 1, "error": "..."}

``t0`` is ``time.perf_counter()`` just before the first call; ``result`` is what the last call
answered. ``perf_counter`` reads CLOCK_MONOTONIC, one clock for every process of the machine,
so the bench compares ``t0`` with the times its own watches saw the outcome. The client closes
and the process ends when standard input does.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config

#: Longest request line (the CustomResourceDefinition with its schema is the largest).
LINE_LIMIT = 2**26


def fill(value: Any, placeholder: str, uid: str) -> Any:
    """``value`` with every string equal to ``placeholder`` replaced by ``uid``."""
    if isinstance(value, str):
        return uid if value == placeholder else value
    if isinstance(value, dict):
        return {k: fill(v, placeholder, uid) for k, v in value.items()}
    if isinstance(value, list):
        return [fill(v, placeholder, uid) for v in value]
    return value


async def serve(kubeconfig: str) -> None:
    configuration = k8s.Configuration()
    await k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    bare = k8s.ApiClient(configuration)

    async def call(
        method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Any:
        return await bare.call_api(
            path,
            method,
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
            response_types_map={200: "object", 201: "object", 202: "object"},
            _return_http_data_only=True,
        )

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=LINE_LIMIT)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    out, _ = await loop.connect_write_pipe(asyncio.Protocol, sys.stdout)

    def answer(reply: dict[str, Any]) -> None:
        out.write(json.dumps(reply).encode() + b"\n")

    async def handle(request: dict[str, Any]) -> None:
        calls = request["calls"]
        placeholder = request.get("uid")
        try:
            t0 = time.perf_counter()
            result = first = await call(*calls[0])
            for method, path, body, content_type in calls[1:]:
                if placeholder:
                    body = fill(body, placeholder, first["metadata"]["uid"])
                result = await call(method, path, body, content_type)
        except Exception as exc:
            answer({"id": request["id"], "error": f"{type(exc).__name__}: {exc}"})
            return
        answer({"id": request["id"], "t0": t0, "result": result})

    running: set[asyncio.Task[None]] = set()
    try:
        while line := await reader.readline():
            task = asyncio.create_task(handle(json.loads(line)))
            running.add(task)
            task.add_done_callback(running.discard)
        await asyncio.gather(*running)
    finally:
        await bare.close()
        out.close()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1]))
