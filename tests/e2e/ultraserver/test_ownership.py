"""Ownership of an UltraServer is what Kubernetes records, not what the allocator remembers:
after the topology allocator restarts with its history lost, a new workload that asks for
every UltraServer is never given the one another workload holds, and the holder keeps it.

Checked where a user looks: every workload's status, every NeuronUltraServer's status and
the Nodes' allocation records, sampled the whole time.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from neuron_dra_cli.stack import process, state
from neuron_dra_cli.stack.components import python_service
from neuron_dra_cli.stack.layout import Layout
from neuron_dra_common.bus import Bus
from neuron_dra_common.bus.declarations import ALLOCATION

from tests.e2e.ultraserver.converged import (
    node_records,
    status_of,
    wait_no_workloads,
    wait_state,
    workload,
)
from tests.fixtures.processes import start_recorded, wait_gone
from tests.fixtures.stack import KubeStack

pytestmark = pytest.mark.stack

ALLOCATOR = "topology-allocator"
NS = "neuron-dra-driver"


def restart_allocator_without_history(stack: KubeStack) -> None:
    """``kill -9`` the topology allocator, purge its allocation stream (the history it
    rebuilds its view from), and start it again as the stack does."""
    layout = Layout(stack.state_dir)
    current = state.load(layout.root)
    assert current is not None
    (entry,) = [c for c in current.components if c.name == ALLOCATOR]
    if process.alive(process.Running(pid=entry.pid, start_ticks=entry.start_ticks)):
        os.kill(entry.pid, signal.SIGKILL)
        wait_gone(entry.pid, timeout=30)

    async def purge() -> None:
        bus = await Bus.connect([stack.nats_url], name="ownership-test")
        try:
            await bus.js.purge_stream(ALLOCATION.name)
        finally:
            await bus.close()

    asyncio.run(purge())
    component = python_service(
        name=ALLOCATOR,
        kind=ALLOCATOR,
        module="neuron_dra_topology_allocator",
        env={"NEURON_DRA_NATS_SERVERS": stack.nats_url, "NEURON_DRA_STRATEGY": "best-fit"},
    )
    start_recorded(layout, component, log=Path(layout.log(ALLOCATOR)))
    stack.wait_for("the topology allocator back", component.ready, timeout=60)


def holders(stack: KubeStack) -> dict[str, set[str]]:
    """Node -> every workload that holds it, by workload status, NeuronUltraServer status
    and Node record."""
    out: dict[str, set[str]] = {}
    for wl in stack.get_json("nusw", "-A")["items"]:
        key = f"{wl['metadata']['namespace']}/{wl['metadata']['name']}"
        for unit in (wl.get("status") or {}).get("allocations") or ():
            for node in unit["nodes"]:
                out.setdefault(node["nodeName"], set()).add(key)
    for nus in stack.get_json("nus", "-n", NS)["items"]:
        for share in (nus.get("status") or {}).get("allocations") or ():
            for node in share["allocatedNodes"]:
                out.setdefault(node, set()).add(share["workloadRef"])
    for node, raw in node_records(stack).items():
        out.setdefault(node, set()).add(json.loads(raw)["workload"])
    return out


def ultraserver_shares(stack: KubeStack) -> dict[str, set[str]]:
    """NeuronUltraServer -> the workloads its status shows."""
    return {
        nus["metadata"]["name"]: {
            s["workloadRef"] for s in (nus.get("status") or {}).get("allocations") or ()
        }
        for nus in stack.get_json("nus", "-n", NS)["items"]
    }


@pytest.fixture
def clean(us_stack: KubeStack) -> Iterator[KubeStack]:
    wait_no_workloads(us_stack)
    yield us_stack
    us_stack.kubectl(
        "delete", "nusw", "holder", "taker", "--ignore-not-found", "--timeout=120s", timeout=150
    )


def test_an_allocator_restarted_without_history_never_gives_a_held_ultraserver_away(
    clean: KubeStack,
) -> None:
    stack = clean
    stack.kubectl("apply", "-f", "-", input=workload("holder", size=4, count=1))
    held = wait_state(stack, "holder", "Allocated")
    nodes = {n["nodeName"] for a in held["allocations"] for n in a["nodes"]}
    (server,) = held["allocatedUltraServers"]

    restart_allocator_without_history(stack)
    # Asks for every UltraServer: the allocator, knowing nothing, would grant all three.
    stack.kubectl("apply", "-f", "-", input=workload("taker", size=4, count=3))

    deadline = time.monotonic() + 30
    seen: list[str] = []
    while time.monotonic() < deadline:
        shared = {n: w for n, w in holders(stack).items() if len(w) > 1}
        assert not shared, f"nodes held by two workloads: {shared}"
        doubled = {us: w for us, w in ultraserver_shares(stack).items() if len(w) > 1}
        assert not doubled, f"UltraServers shown held by two workloads: {doubled}"
        taker: dict[str, Any] = status_of(stack, "taker")
        seen.append(str(taker.get("reason") or ""))
        time.sleep(1)

    holder = status_of(stack, "holder")
    assert holder["state"] == "Allocated"
    assert {n["nodeName"] for a in holder["allocations"] for n in a["nodes"]} == nodes
    assert ultraserver_shares(stack)[server] == {"default/holder"}
    records = {n: json.loads(r)["workload"] for n, r in node_records(stack).items()}
    assert all(records.get(n) == "default/holder" for n in nodes), records
    taker = status_of(stack, "taker")
    assert taker["state"] == "Pending", taker
    assert not taker.get("allocations"), taker
    assert "AllocationConflict" in seen or "InsufficientCapacity" in seen, seen
