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
import subprocess
import textwrap
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
from tests.fixtures.stack import REPO, KubeStack

pytestmark = pytest.mark.stack

ALLOCATOR = "topology-allocator"
NS = "neuron-dra-driver"
#: Allocators started here, left running for the session (``dev down`` stops them); held so
#: their handles are not collected while the process runs.
_LEFT_RUNNING: list[subprocess.Popen[bytes]] = []


def restart_allocator_without_history(stack: KubeStack) -> None:
    """``kill -9`` the topology allocator, delete its allocation stream (the history it
    rebuilds its view from; the allocator makes it again, empty), and start it again as the
    stack does."""
    layout = Layout(stack.state_dir)
    current = state.load(layout.root)
    assert current is not None
    (entry,) = [c for c in current.components if c.name == ALLOCATOR]
    if process.alive(process.Running(pid=entry.pid, start_ticks=entry.start_ticks)):
        os.kill(entry.pid, signal.SIGKILL)
        wait_gone(entry.pid, timeout=30)

    async def forget() -> None:
        bus = await Bus.connect(
            [stack.nats_url], name="ownership-test", credentials=stack.bus_credentials()
        )
        try:
            await bus.js.delete_stream(ALLOCATION.name)
        finally:
            await bus.close()

    asyncio.run(forget())
    component = python_service(
        name=ALLOCATOR,
        kind=ALLOCATOR,
        module="neuron_dra_topology_allocator",
        env={**stack.service_env(), "NEURON_DRA_STRATEGY": "best-fit"},
    )
    _LEFT_RUNNING.append(start_recorded(layout, component, log=Path(layout.log(ALLOCATOR))))
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
    taker = stack.wait_for(
        "taker Pending",
        lambda: (s := status_of(stack, "taker")).get("state") == "Pending" and s,
        timeout=60,
    )
    assert not taker.get("allocations"), taker
    assert {"AllocationConflict", "InsufficientCapacity"} & {*seen, taker["reason"]}, seen


TEAM_TEMPLATE = REPO / "examples" / "aws-dra-guide" / "v1" / "us-4-node-config.yaml"
TEAM_POD = textwrap.dedent(
    """\
    apiVersion: v1
    kind: Pod
    metadata:
      name: team-pod
      namespace: default
    spec:
      containers:
      - name: ctr0
        image: public.ecr.aws/ubuntu/ubuntu:22.04
        command: ["sleep", "infinity"]
        resources:
          claims:
          - name: node
      resourceClaims:
      - name: node
        resourceClaimTemplateName: us-4-node-config
    """
)


@pytest.fixture
def team(us_stack: KubeStack) -> Iterator[KubeStack]:
    """A user's own template (AWS's guide's) and a pod running with a claim made from it."""
    stack = us_stack
    wait_no_workloads(stack)
    stack.kubectl("apply", "-f", str(TEAM_TEMPLATE))
    stack.kubectl("apply", "-f", "-", input=TEAM_POD)
    try:
        stack.wait_for(
            "team-pod Running",
            lambda: stack.get_json("pod", "team-pod")["status"].get("phase") == "Running",
            timeout=120,
        )
        yield stack
    finally:
        stack.kubectl("delete", "nusw", "intruder", "--ignore-not-found", "--timeout=120s")
        stack.kubectl("delete", "pod", "team-pod", "--ignore-not-found", "--timeout=60s")
        stack.kubectl("delete", "-f", str(TEAM_TEMPLATE), "--ignore-not-found")


def test_a_workload_naming_anothers_template_leaves_it_and_its_pods_alone(
    team: KubeStack,
) -> None:
    stack = team
    before = stack.get_json("resourceclaimtemplates", "us-4-node-config")
    intruder = workload("intruder", size=4) + textwrap.indent(
        "resourceClaimTemplate:\n  name: us-4-node-config\n", "  "
    )
    stack.kubectl("apply", "-f", "-", input=intruder)
    status = stack.wait_for(
        "intruder reports the template conflict",
        lambda: (s := status_of(stack, "intruder")).get("reason") == "TemplateConflict" and s,
        timeout=90,
    )
    assert "ResourceClaimTemplate default/us-4-node-config" in status["message"]
    events = stack.get_json(
        "events", "--field-selector", "involvedObject.name=intruder,reason=TemplateConflict"
    )["items"]
    assert events, "a TemplateConflict Event on the workload"
    after = stack.get_json("resourceclaimtemplates", "us-4-node-config")
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert not after["metadata"].get("ownerReferences")

    stack.kubectl("delete", "nusw", "intruder", "--timeout=120s", timeout=150)
    pod = stack.get_json("pod", "team-pod")
    assert not pod["metadata"].get("deletionTimestamp"), "the team's pod is left running"
    assert pod["status"].get("phase") == "Running"
    assert (
        stack.get_json("resourceclaimtemplates", "us-4-node-config")["metadata"]["uid"]
        == (before["metadata"]["uid"])
    )
