"""What a user reads off the stack for these tests: the pods' view of their devices
(``neuron-dra dev env``) and how many claim events the audit stream stored."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import nats

from tests.fixtures.stack import REPO, KubeStack, neuron_dra

EXAMPLES = REPO / "examples"


def container_views(stack: KubeStack, pod: str, namespace: str = "default") -> dict[str, Any]:
    """Container name -> what ``neuron-dra dev env POD -o json`` says it gets."""
    proc = neuron_dra(
        "dev",
        "env",
        pod,
        "-n",
        namespace,
        "--state-dir",
        str(stack.state_dir),
        "-o",
        "json",
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {c["name"]: c for c in json.loads(proc.stdout)["containers"]}


def device_paths(view: dict[str, Any]) -> list[str]:
    paths = [d["path"] for d in view["deviceNodes"]]
    return sorted(paths, key=lambda p: int(p.removeprefix("/dev/neuron")))


async def _count(stack: KubeStack, subject: str, stream: str) -> int:
    given = stack.bus_credentials()
    nc = await nats.connect(
        stack.nats_url, token=given.token() if given.token_file else None, tls=given.tls()
    )
    try:
        info = await nc.jetstream().stream_info(stream, subjects_filter=subject)
        return (info.state.subjects or {}).get(subject, 0)
    finally:
        await nc.close()


def stored(stack: KubeStack, subject: str, *, stream: str = "NEURON_CLAIMS") -> int:
    """How many events the stream holds on ``subject``."""
    return asyncio.run(_count(stack, subject, stream))
