"""A device of an allocated UltraServer node fails (``neuron-dra dev fault``, as the Neuron
driver shows it): what a user sees, and what each failure strategy does, then the repair.

One stack for the module, one workload at a time; the faults are spread over the tests so
that each severity class meets a strategy here (uncorrectable: ReplaceAffected and NoOp;
degraded: NoOp), lost nodes are ``test_node_lost``'s, and every cell of the fault type x
strategy matrix is asserted without a stack in ``tests/unit/ultraserver/test_fault_matrix``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.failure.test_node_lost import (
    allocate,
    allocated_nodes,
    condition,
    running_pods,
    status,
    workload_events,
)
from tests.e2e.health.support import alerts, device_taints, fault
from tests.e2e.health.support import condition as node_condition
from tests.fixtures.stack import KubeStack

pytestmark = pytest.mark.stack

KEY = "neuron.aws.com/hardware-error"
DEVICE = 5
NAME = f"neurondevice{DEVICE}"


def taints(stack: KubeStack, node: str, device: str = NAME) -> set[tuple[str, str, str]]:
    return {(t["key"], t["value"], t["effect"]) for t in device_taints(stack, node).get(device, [])}


def neuron_health(stack: KubeStack, node: str) -> tuple[str, str]:
    found = node_condition(stack, node, "NeuronHealth")
    return str(found.get("status", "")), str(found.get("reason", ""))


@pytest.fixture
def workloads(default_stack: KubeStack) -> Iterator[list[str]]:
    """The names of the test's workloads; deleted, and the fleet repaired, afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        default_stack.kubectl("delete", "deployment", name, "--ignore-not-found", "--timeout=120s")
        default_stack.kubectl("delete", "nusw", name, "--ignore-not-found", "--timeout=120s")


def repair_and_check(stack: KubeStack, node: str, *, alertnames: tuple[str, ...]) -> None:
    """Repair every device of ``node``: untainted, NeuronHealth clear, its alerts resolved."""
    fault(stack, node, "repair")
    stack.wait_for(
        f"{node} without taints",
        lambda: not any(device_taints(stack, node).values()),
        timeout=60,
    )
    stack.wait_for(
        f"NeuronHealth of {node} back to NeuronHasNoError",
        lambda: neuron_health(stack, node) == ("False", "NeuronHasNoError"),
    )
    for alertname in alertnames:
        stack.wait_for(
            f"{alertname} resolved in Alertmanager",
            lambda name=alertname: not alerts(stack, alertname=name),  # type: ignore[misc]
            timeout=90,
        )


def test_replace_affected_moves_off_an_uncorrectable_device_and_the_repair_clears_it(
    default_stack: KubeStack, workloads: list[str]
) -> None:
    stack = default_stack
    workloads.append("fault-replace")
    before = allocate(stack, "fault-replace", "ReplaceAffected")
    old = before["allocatedUltraServers"][0]
    old_nodes = allocated_nodes(before)
    victim = old_nodes[2]

    fault(stack, victim, "sram", device=DEVICE)
    stack.wait_for(
        f"the NoExecute taint on {victim}/{NAME}",
        lambda: (KEY, "SRAM_UNCORRECTABLE_ERROR", "NoExecute") in taints(stack, victim),
    )
    # The node's whole-node device carries its worst chip's taint: the node is not whole.
    assert (KEY, "SRAM_UNCORRECTABLE_ERROR", "NoExecute") in taints(stack, victim, "neuronnode")
    assert neuron_health(stack, victim) == ("True", "NeuronHasError_SRAM_UNCORRECTABLE_ERROR")
    [alert] = stack.wait_for(
        "NeuronDeviceUnhealthy in Alertmanager",
        lambda: alerts(stack, alertname="NeuronDeviceUnhealthy", node=victim, device=NAME),
    )
    assert alert["labels"]["severity"] == "critical"
    assert "SRAM_UNCORRECTABLE_ERROR" in alert["annotations"]["summary"]

    def moved() -> dict[str, Any] | None:
        found = status(stack, "fault-replace")
        if found.get("state") == "Allocated" and found["allocatedUltraServers"] != [old]:
            return found
        return None

    after = stack.wait_for("the workload Allocated on the spare", moved, timeout=180)
    new = after["allocatedUltraServers"][0]
    new_nodes = allocated_nodes(after)
    assert set(new_nodes).isdisjoint(old_nodes), (old_nodes, new_nodes)
    assert condition(after, "Ready") == "True"
    replaced = workload_events(stack, "fault-replace", "Replaced")
    assert any(f"UltraServer {old} with {new}" in m for m in replaced), replaced
    failed = workload_events(stack, "fault-replace", "NodeFailed")
    assert any(victim in m and f"{NAME} uncorrectable SRAM" in m for m in failed), failed
    stack.wait_for(
        "4 pods Running on the spare",
        lambda: (
            len(p := running_pods(stack, "fault-replace")) == 4
            and set(p.values()) <= set(new_nodes)
        ),
        timeout=240,
    )

    repair_and_check(stack, victim, alertnames=("NeuronDeviceUnhealthy",))
    # The repaired UltraServer does not take the workload back: no flapping.
    time.sleep(5)
    settled = status(stack, "fault-replace")
    assert (settled["state"], settled["allocatedUltraServers"]) == ("Allocated", [new])
    assert len(workload_events(stack, "fault-replace", "Replaced")) == 1


def test_no_op_keeps_running_on_a_degraded_device_and_reports_an_uncorrectable_one(
    default_stack: KubeStack, workloads: list[str]
) -> None:
    stack = default_stack
    workloads.append("fault-noop")
    before = allocate(stack, "fault-noop", "NoOp")
    nodes = allocated_nodes(before)
    victim = nodes[1]
    pods_before = running_pods(stack, "fault-noop")

    # Degraded (a repairable HBM error): no new claims on the device, the workload runs on.
    fault(stack, victim, "hbm-repairable", device=DEVICE)
    stack.wait_for(
        f"the NoSchedule taint on {victim}/{NAME}",
        lambda: taints(stack, victim) == {(KEY, "HBM_REPAIRABLE_ERROR", "NoSchedule")},
    )
    assert neuron_health(stack, victim) == ("True", "NeuronHasError_HBM_REPAIRABLE_ERROR")
    [alert] = stack.wait_for(
        "a warning NeuronDeviceUnhealthy in Alertmanager",
        lambda: alerts(stack, alertname="NeuronDeviceUnhealthy", node=victim, device=NAME),
    )
    assert alert["labels"]["severity"] == "warning"
    # The operator read the same health stream the alert came from; give it a moment.
    time.sleep(3)
    found = status(stack, "fault-noop")
    assert (found["state"], condition(found, "Ready")) == ("Allocated", "True")
    assert workload_events(stack, "fault-noop", "NodeFailed") == []
    assert running_pods(stack, "fault-noop") == pods_before

    # Uncorrectable (an NC error) on the same device: NoOp reports, and moves nothing.
    fault(stack, victim, "nc", device=DEVICE)
    stack.wait_for(
        f"the NoExecute taint on {victim}/{NAME}",
        lambda: (KEY, "NC_UNCORRECTABLE_ERROR", "NoExecute") in taints(stack, victim),
    )

    def degraded() -> dict[str, Any] | None:
        found = status(stack, "fault-noop")
        return found if condition(found, "Degraded") == "True" else None

    found = stack.wait_for("the workload Degraded", degraded, timeout=120)
    assert found["state"] == "PartiallyAllocated"
    assert condition(found, "Ready") == "False"
    assert allocated_nodes(found) == nodes
    failed = workload_events(stack, "fault-noop", "NodeFailed")
    assert any(victim in m and "NC_UNCORRECTABLE_ERROR" in m and "NoOp" in m for m in failed)
    assert workload_events(stack, "fault-noop", "Replaced") == []
    assert neuron_health(stack, victim) == ("True", "NeuronHasError_NC_UNCORRECTABLE_ERROR")
    stack.wait_for(
        "a critical NeuronDeviceUnhealthy in Alertmanager",
        lambda: [
            a
            for a in alerts(stack, alertname="NeuronDeviceUnhealthy", node=victim, device=NAME)
            if a["labels"]["severity"] == "critical"
        ],
    )
    stack.wait_for(
        "NeuronWorkloadDegraded in Alertmanager",
        lambda: alerts(stack, alertname="NeuronWorkloadDegraded", workload="fault-noop"),
    )
    # Kubernetes' device taint eviction takes the pod off the failed node; the others stay.
    stack.wait_for(
        f"the pod on {victim} evicted",
        lambda: victim not in running_pods(stack, "fault-noop").values(),
        timeout=90,
    )
    healthy = {p: n for p, n in pods_before.items() if n != victim}
    assert healthy.items() <= running_pods(stack, "fault-noop").items()

    # The repair: untainted, alerts resolved, the workload Ready on its own nodes again.
    repair_and_check(stack, victim, alertnames=("NeuronDeviceUnhealthy", "NeuronWorkloadDegraded"))
    stack.kubectl("wait", "--for=condition=Ready", "nusw/fault-noop", "--timeout=120s", timeout=150)
    assert allocated_nodes(status(stack, "fault-noop")) == nodes
    stack.wait_for(
        "4 pods Running on the workload's nodes again",
        lambda: len(p := running_pods(stack, "fault-noop")) == 4 and set(p.values()) <= set(nodes),
        timeout=240,
    )
