"""A node of an allocated UltraServer dies (its kubelet killed with SIGKILL): the failure
detector declares it lost within seconds and the workload's failure strategy acts.

Each run logs how long it took from the kill to NodeLost and from NodeLost to the workload
re-allocated (measured here, not asserted: the machine may be busy).
"""

from __future__ import annotations

import calendar
import json
import logging
import os
import signal
import textwrap
import time
from typing import Any

import pytest

from tests.fixtures.stack import KubeStack

pytestmark = pytest.mark.stack

log = logging.getLogger(__name__)


def workload_yaml(name: str, strategy: str) -> str:
    return textwrap.dedent(
        f"""\
        apiVersion: neuron.aws.com/v1beta1
        kind: NeuronUltraServerWorkload
        metadata:
          name: {name}
        spec:
          instanceType: trn2u.48xlarge
          topologySize: 4
          serverCount: 1
          allocationPolicy:
            failureStrategy: {strategy}
          resourceClaimTemplate:
            name: {name}-rct
        ---
        apiVersion: apps/v1
        kind: Deployment
        metadata:
          name: {name}
        spec:
          replicas: 4
          selector:
            matchLabels: {{app: {name}}}
          template:
            metadata:
              labels: {{app: {name}}}
            spec:
              resourceClaims:
                - name: neuron-claim
                  resourceClaimTemplateName: {name}-rct
              containers:
                - name: training-container
                  image: public.ecr.aws/docker/library/alpine:latest
                  command: ["sleep", "infinity"]
                  resources:
                    claims:
                      - name: neuron-claim
        """
    )


def status(stack: KubeStack, name: str) -> dict[str, Any]:
    found: dict[str, Any] = stack.get_json("nusw", name).get("status") or {}
    return found


def condition(found: dict[str, Any], kind: str) -> str:
    for cond in found.get("conditions") or ():
        if cond["type"] == kind:
            return str(cond["status"])
    return ""


def allocated_nodes(found: dict[str, Any]) -> list[str]:
    return [n["nodeName"] for a in found.get("allocations") or () for n in a["nodes"]]


def running_pods(stack: KubeStack, app: str) -> dict[str, str]:
    """pod -> node of the app's Running pods that are not being deleted."""
    pods = stack.get_json("pods", "-l", f"app={app}")["items"]
    return {
        p["metadata"]["name"]: p["spec"].get("nodeName", "")
        for p in pods
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    }


def kill_kubelet(stack: KubeStack, node: str) -> float:
    """SIGKILL the node's kubelet process, as the stack recorded it; the time of the kill."""
    state = json.loads((stack.state_dir / "state.json").read_text())
    (pid,) = [c["pid"] for c in state["components"] if c["name"] == f"node-{node}"]
    os.kill(pid, signal.SIGKILL)
    return time.time()


def node_events(stack: KubeStack, node: str, reason: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = stack.get_json(
        "events",
        "-n",
        "default",
        "--field-selector",
        f"involvedObject.kind=Node,involvedObject.name={node},reason={reason}",
    )["items"]
    return items


def workload_events(stack: KubeStack, name: str, reason: str) -> list[str]:
    items = stack.get_json(
        "events", "--field-selector", f"involvedObject.name={name},reason={reason}"
    )["items"]
    return [str(e["message"]) for e in items]


def stamp(event: dict[str, Any]) -> float:
    raw = str(event.get("lastTimestamp") or event.get("eventTime") or "")
    return calendar.timegm(time.strptime(raw[:19], "%Y-%m-%dT%H:%M:%S"))


def allocate(stack: KubeStack, name: str, strategy: str) -> dict[str, Any]:
    stack.kubectl("apply", "-f", "-", input=workload_yaml(name, strategy))
    stack.kubectl("wait", "--for=condition=Ready", f"nusw/{name}", "--timeout=180s")
    found = status(stack, name)
    nodes = set(allocated_nodes(found))
    stack.wait_for(
        f"4 pods of {name} Running on its nodes",
        lambda: len(pods := running_pods(stack, name)) == 4 and set(pods.values()) <= nodes,
        timeout=240,
    )
    return found


def test_replace_affected_moves_a_workload_off_a_killed_node_onto_the_spare(
    default_stack: KubeStack,
) -> None:
    stack = default_stack
    before = allocate(stack, "replace", "ReplaceAffected")
    old = before["allocatedUltraServers"][0]
    old_nodes = allocated_nodes(before)
    victim = old_nodes[1]

    killed = kill_kubelet(stack, victim)
    lost = stack.wait_for(
        f"NodeLost on {victim}", lambda: node_events(stack, victim, "NodeLost"), timeout=120
    )
    declared = time.time()
    log.warning(
        "kill -> NodeLost Event seen: %.1f s (event stamped %.0f s after the kill)",
        declared - killed,
        stamp(lost[0]) - killed,
    )

    def moved() -> dict[str, Any] | None:
        found = status(stack, "replace")
        if found.get("state") == "Allocated" and found["allocatedUltraServers"] != [old]:
            return found
        return None

    after = stack.wait_for("the workload Allocated elsewhere", moved, timeout=180)
    reallocated = time.time()
    log.warning("NodeLost -> re-allocated: %.1f s", reallocated - declared)
    new = after["allocatedUltraServers"][0]
    new_nodes = allocated_nodes(after)
    assert new != old
    assert set(new_nodes).isdisjoint(old_nodes), (old_nodes, new_nodes)
    # The spare was free: all four nodes of one other UltraServer, ranks 0..3 again.
    assert len(new_nodes) == 4
    assert [n["topologyId"] for n in after["allocations"][0]["nodes"]] == [0, 1, 2, 3]
    assert condition(after, "Ready") == "True"
    stack.kubectl("wait", "--for=condition=Ready", "nusw/replace", "--timeout=10s")

    # The Event names the failed UltraServer and the spare.
    replaced = workload_events(stack, "replace", "Replaced")
    assert any(f"UltraServer {old} with {new}" in m for m in replaced), replaced
    failed = workload_events(stack, "replace", "NodeFailed")
    assert any(victim in m and "lost" in m for m in failed), failed

    # Its pods run on the spare's nodes, none left on the failed UltraServer.
    pods = stack.wait_for(
        "4 pods Running on the new UltraServer",
        lambda: (
            (p := running_pods(stack, "replace"))
            and len(p) == 4
            and set(p.values()) <= set(new_nodes)
            and p
        ),
        timeout=240,
    )
    log.warning("kill -> pods Running on the spare: %.1f s", time.time() - killed)
    assert set(pods.values()) <= set(new_nodes)

    # Settled: it stays where it is (no Allocating -> Allocated loop).
    time.sleep(10)
    settled = status(stack, "replace")
    assert settled["state"] == "Allocated"
    assert settled["allocatedUltraServers"] == [new]
    assert len(workload_events(stack, "replace", "Replaced")) == 1


def test_no_op_reports_a_killed_node_and_leaves_the_workload_where_it_is(
    default_stack: KubeStack,
) -> None:
    stack = default_stack
    # Room for it: the workload of the first test goes (its UltraServer has all nodes up).
    stack.kubectl("delete", "deployment", "replace", "--ignore-not-found", "--timeout=120s")
    stack.kubectl("delete", "nusw", "replace", "--ignore-not-found", "--timeout=120s")
    before = allocate(stack, "noop", "NoOp")
    nodes = allocated_nodes(before)
    pods_before = running_pods(stack, "noop")
    victim = nodes[2]
    killed = kill_kubelet(stack, victim)

    def degraded() -> dict[str, Any] | None:
        found = status(stack, "noop")
        return found if condition(found, "Degraded") == "True" else None

    found = stack.wait_for("the workload Degraded", degraded, timeout=120)
    log.warning("kill -> NoOp workload Degraded: %.1f s", time.time() - killed)
    assert found["state"] == "PartiallyAllocated"
    assert condition(found, "Ready") == "False"
    assert allocated_nodes(found) == nodes
    assert victim in found["message"]
    failed = workload_events(stack, "noop", "NodeFailed")
    assert any(victim in m and "NoOp" in m for m in failed), failed
    assert workload_events(stack, "noop", "Replaced") == []
    # Nothing moved: the pods on the healthy nodes still run where they ran.
    healthy = {p: n for p, n in pods_before.items() if n != victim}
    assert healthy.items() <= running_pods(stack, "noop").items()
