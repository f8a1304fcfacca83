"""A node of an allocated UltraServer dies (its kubelet killed with SIGKILL): the failure
detector declares it lost within seconds and the workload's failure strategy acts.

Each run logs how long it took from the kill to NodeLost and from NodeLost to the workload
re-allocated (measured here, not asserted: the machine may be busy). Every wait is for what a
user sees, with a deadline long enough for a machine running several stacks at once.

The module's stack first serves a device fault (``neuron-dra dev fault``), which the repair
undoes, so the kills after it find the fleet whole: degraded and uncorrectable errors meet
ReplaceAffected there, lost nodes meet every strategy here and in ``test_restart_all``, and
each cell of the fault type x strategy matrix is asserted without a stack in
``tests/unit/ultraserver/test_fault_matrix``.
"""

from __future__ import annotations

import calendar
import json
import logging
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.e2e.health.support import (
    HARDWARE_ERROR,
    alerts,
    device_taints,
    fault,
    neuron_health,
    node_events,
    taints,
)
from tests.e2e.ultraserver.converged import deployment, workload
from tests.fixtures.stack import KubectlFailed, KubeStack

pytestmark = pytest.mark.stack

log = logging.getLogger(__name__)

#: Deadlines of the waits for what the services show (taints, conditions, alerts, the move):
#: seconds on a quiet machine, tens of seconds with three stacks on two cores.
SHOWN = 180
MOVED = 300


def workload_yaml(name: str, strategy: str) -> str:
    """A 1 x 4 workload and the Deployment of its four pods, as AWS's guide writes them."""
    rct = f"{name}-rct"
    return "---\n".join(
        (
            workload(name, size=4, strategy=strategy, template=rct),
            deployment(name, template=rct, replicas=4),
        )
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


def workload_events(stack: KubeStack, name: str, reason: str) -> list[str]:
    items = stack.get_json(
        "events", "--field-selector", f"involvedObject.name={name},reason={reason}"
    )["items"]
    return [str(e["message"]) for e in items]


def stamp(event: dict[str, Any]) -> float:
    raw = str(event.get("lastTimestamp") or event.get("eventTime") or "")
    return calendar.timegm(time.strptime(raw[:19], "%Y-%m-%dT%H:%M:%S"))


def holds(what: str, check: Callable[[], object], *, seconds: float) -> None:
    """``check`` stays true for ``seconds``: read again and again, failing at the first read
    that shows otherwise (a loop that moves the workload back and forth shows within it)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            shown = check()
        except KubectlFailed:
            shown = True  # not read this time (a busy apiserver): read again
        assert shown, f"{what} no longer holds"
        time.sleep(1)


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


def test_replace_affected_stays_on_a_degraded_device_and_moves_off_an_uncorrectable_one(
    default_stack: KubeStack,
) -> None:
    stack = default_stack
    victim = ""
    try:
        before = allocate(stack, "faulty", "ReplaceAffected")
        old = before["allocatedUltraServers"][0]
        old_nodes = allocated_nodes(before)
        victim, device = old_nodes[2], "neurondevice5"
        pods_before = running_pods(stack, "faulty")

        # Degraded (a repairable HBM error): no new claims on the device, nothing moves.
        fault(stack, victim, "hbm-repairable", device=5)
        stack.wait_for(
            f"the NoSchedule taint on {victim}/{device}",
            lambda: (
                taints(stack, victim, device)
                == {(HARDWARE_ERROR, "HBM_REPAIRABLE_ERROR", "NoSchedule")}
            ),
            timeout=SHOWN,
        )
        # The probe writes the Node condition beside the event the taint comes from.
        stack.wait_for(
            "NeuronHealth NeuronHasError_HBM_REPAIRABLE_ERROR",
            lambda: neuron_health(stack, victim) == ("True", "NeuronHasError_HBM_REPAIRABLE_ERROR"),
            timeout=SHOWN,
        )
        [alert] = stack.wait_for(
            "a warning NeuronDeviceUnhealthy in Alertmanager",
            lambda: alerts(stack, alertname="NeuronDeviceUnhealthy", node=victim, device=device),
            timeout=SHOWN,
        )
        assert alert["labels"]["severity"] == "warning"
        # Still Ready where it was, its pods untouched. That the operator never took the
        # degraded device for a failure is checked once it has read the fault after it: the
        # only NodeFailed it reports then is the uncorrectable one.
        found = status(stack, "faulty")
        assert (found["state"], condition(found, "Ready")) == ("Allocated", "True")
        assert found["allocatedUltraServers"] == [old]
        assert running_pods(stack, "faulty") == pods_before

        # Uncorrectable (SRAM) on the same device: NoExecute, and the workload moves.
        fault(stack, victim, "sram", device=5)
        sram = (HARDWARE_ERROR, "SRAM_UNCORRECTABLE_ERROR", "NoExecute")
        # The whole-node device carries its worst chip's taint: the node is not whole. Both
        # are in the node's pool, which a reader may see between two of its slices' writes.
        stack.wait_for(
            f"the NoExecute taint on {victim}/{device} and {victim}/neuronnode",
            lambda: (
                sram in taints(stack, victim, device)
                and sram in taints(stack, victim, "neuronnode")
            ),
            timeout=SHOWN,
        )
        stack.wait_for(
            "NeuronHealth NeuronHasError_SRAM_UNCORRECTABLE_ERROR",
            lambda: (
                neuron_health(stack, victim) == ("True", "NeuronHasError_SRAM_UNCORRECTABLE_ERROR")
            ),
            timeout=SHOWN,
        )
        stack.wait_for(
            "a critical NeuronDeviceUnhealthy in Alertmanager",
            lambda: [
                a
                for a in alerts(stack, alertname="NeuronDeviceUnhealthy", node=victim)
                if a["labels"]["severity"] == "critical"
            ],
            timeout=SHOWN,
        )

        def moved() -> dict[str, Any] | None:
            found = status(stack, "faulty")
            if found.get("state") == "Allocated" and found["allocatedUltraServers"] != [old]:
                return found
            return None

        after = stack.wait_for("the workload Allocated on the spare", moved, timeout=MOVED)
        new = after["allocatedUltraServers"][0]
        new_nodes = allocated_nodes(after)
        assert set(new_nodes).isdisjoint(old_nodes), (old_nodes, new_nodes)
        assert condition(after, "Ready") == "True"
        replaced = workload_events(stack, "faulty", "Replaced")
        assert any(f"UltraServer {old} with {new}" in m for m in replaced), replaced
        # The uncorrectable error is the one failure reported: the degraded one before it
        # failed nothing.
        failed = workload_events(stack, "faulty", "NodeFailed")
        assert failed, "no NodeFailed Event"
        assert all(f"{victim} {device} uncorrectable SRAM" in m for m in failed), failed
        assert not any("HBM" in m for m in failed), failed
        stack.wait_for(
            "4 pods Running on the spare",
            lambda: (
                len(p := running_pods(stack, "faulty")) == 4 and set(p.values()) <= set(new_nodes)
            ),
            timeout=MOVED,
        )

        # The repair (a driver reload): untainted, NeuronHealth clear, the alert resolved;
        # the workload stays where it is (no flapping back).
        fault(stack, victim, "repair")
        stack.wait_for(
            f"{victim} without taints",
            lambda: not any(device_taints(stack, victim).values()),
            timeout=SHOWN,
        )
        stack.wait_for(
            "NeuronHealth back to NeuronHasNoError",
            lambda: neuron_health(stack, victim) == ("False", "NeuronHasNoError"),
            timeout=SHOWN,
        )
        stack.wait_for(
            "NeuronDeviceUnhealthy resolved",
            lambda: not alerts(stack, alertname="NeuronDeviceUnhealthy", node=victim),
            timeout=SHOWN,
        )
        settled = status(stack, "faulty")
        assert (settled["state"], settled["allocatedUltraServers"]) == ("Allocated", [new])
        assert len(workload_events(stack, "faulty", "Replaced")) == 1
    finally:
        # The next tests want the whole fleet free and healthy.
        if victim:
            fault(stack, victim, "repair")
        stack.kubectl("delete", "deployment", "faulty", "--ignore-not-found", "--timeout=120s")
        stack.kubectl("delete", "nusw", "faulty", "--ignore-not-found", "--timeout=120s")


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
    [alert] = stack.wait_for(
        "NeuronNodeLost in Alertmanager",
        lambda: alerts(stack, alertname="NeuronNodeLost", node=victim),
        timeout=SHOWN,
    )
    assert alert["labels"]["severity"] == "critical"

    def moved() -> dict[str, Any] | None:
        found = status(stack, "replace")
        if found.get("state") == "Allocated" and found["allocatedUltraServers"] != [old]:
            return found
        return None

    after = stack.wait_for("the workload Allocated elsewhere", moved, timeout=MOVED)
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
    stack.kubectl("wait", "--for=condition=Ready", "nusw/replace", f"--timeout={SHOWN}s")

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
        timeout=MOVED,
    )
    log.warning("kill -> pods Running on the spare: %.1f s", time.time() - killed)
    assert set(pods.values()) <= set(new_nodes)

    # Settled: it stays where it is (no Allocating -> Allocated loop).
    holds(
        f"replace Allocated on {new}",
        lambda: (
            (s := status(stack, "replace"))["state"] == "Allocated"
            and s["allocatedUltraServers"] == [new]
        ),
        seconds=15,
    )
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

    found = stack.wait_for("the workload Degraded", degraded, timeout=SHOWN)
    log.warning("kill -> NoOp workload Degraded: %.1f s", time.time() - killed)
    assert found["state"] == "PartiallyAllocated"
    assert condition(found, "Ready") == "False"
    assert allocated_nodes(found) == nodes
    assert victim in found["message"]
    failed = workload_events(stack, "noop", "NodeFailed")
    assert any(victim in m and "NoOp" in m for m in failed), failed
    assert workload_events(stack, "noop", "Replaced") == []
    stack.wait_for(
        "NeuronNodeLost and NeuronWorkloadDegraded in Alertmanager",
        lambda: (
            alerts(stack, alertname="NeuronNodeLost", node=victim)
            and alerts(stack, alertname="NeuronWorkloadDegraded", workload="noop")
        ),
        timeout=SHOWN,
    )
    # Nothing moved: the pods on the healthy nodes still run where they ran.
    healthy = {p: n for p, n in pods_before.items() if n != victim}
    assert healthy.items() <= running_pods(stack, "noop").items()
