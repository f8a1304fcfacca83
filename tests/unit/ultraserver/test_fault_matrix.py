"""Every fault type on a node of a workload of every failure strategy, without a stack.

Each cell runs the product's own pure pieces in the order the bus carries a fault: the
health probe's book makes the event (type -> severity and action), the node's conditions
follow, the slice publisher's taints (severity -> effect), the alert rules (severity ->
alert), then the operator's reconciler against the real allocator (uncorrectable or lost ->
the strategy acts; degraded -> nothing moves), and the repair undoes each. The end-to-end
runs on the local stack (``tests/e2e/failure``) take one cell of each strategy and each
severity class.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Final

import pytest
from neuron_dra_alerts.rules import DEVICE_UNHEALTHY, NODE_LOST, evaluate
from neuron_dra_common.events import AnyEvent, NodeLost, NodeRecovered
from neuron_dra_health_monitor.probestate import Fault, HealthBook, node_conditions, severity_of
from neuron_dra_slice_publisher.taints import HARDWARE_ERROR_KEY, NODE_LOST_KEY, HealthTaints

from tests.unit.ultraserver.memory_api import World

NOW: Final = datetime(2026, 11, 26, 9, 0, tzinfo=UTC)
DEVICE: Final = "neurondevice5"

#: ``neuron-dra dev fault`` type -> (the driver's error type, severity). ``lost`` has none.
FAULTS: Final[dict[str, tuple[str, str]]] = {
    "sram": ("SRAM_UNCORRECTABLE_ERROR", "uncorrectable"),
    "nc": ("NC_UNCORRECTABLE_ERROR", "uncorrectable"),
    "hbm": ("HBM_UNCORRECTABLE_ERROR", "uncorrectable"),
    "dma": ("DMA_ERROR", "uncorrectable"),
    "hbm-repairable": ("HBM_REPAIRABLE_ERROR", "degraded"),
    "link-down": ("NEURONLINK_DOWN", "degraded"),
    "lost": ("", "lost"),
}
STRATEGIES: Final = ("NoOp", "RestartAll", "ReplaceAffected", "MigrateAffected")
EFFECT: Final = {"degraded": "NoSchedule", "uncorrectable": "NoExecute", "lost": "NoExecute"}
ALERT: Final = {
    "degraded": (DEVICE_UNHEALTHY, "warning"),
    "uncorrectable": (DEVICE_UNHEALTHY, "critical"),
    "lost": (NODE_LOST, "critical"),
}


def fail(kind: str, node: str) -> AnyEvent:
    """The event the health probe (or, for ``lost``, the failure detector) publishes."""
    if kind == "lost":
        return NodeLost(node=node, detected_at=NOW, reason="no heartbeat for 3.0 s")
    error_type, _ = FAULTS[kind]
    book = HealthBook(node=node)
    event = book.add(DEVICE, Fault(error_type=error_type, source="kernel"), now=NOW)
    assert event is not None
    return event


def repair(kind: str, node: str) -> AnyEvent:
    if kind == "lost":
        return NodeRecovered(node=node, detected_at=NOW, lost_for_seconds=30.0)
    error_type, _ = FAULTS[kind]
    book = HealthBook(node=node)
    book.add(DEVICE, Fault(error_type=error_type, source="kernel"), now=NOW)
    event = book.clear(DEVICE, sources=("kernel",), why="driver reloaded", now=NOW)
    assert event is not None
    return event


def apply(world: World, event: AnyEvent) -> None:
    """What the operator and the allocator take from the health stream."""
    world.health.apply(event)
    world.projection.apply(event)


def taints_of(event: AnyEvent, node: str, taints: HealthTaints) -> set[tuple[str, str]]:
    if isinstance(event, NodeLost | NodeRecovered):
        taints.set_lost(node, isinstance(event, NodeLost))
    else:
        taints.apply(event)  # type: ignore[arg-type]
    got = taints.for_node(node, [DEVICE, "neuronnode"])
    return {(t.key, t.effect) for t in got.get(DEVICE, ())}


def condition(world: World, kind: str) -> str:
    (found,) = [c["status"] for c in world.status["conditions"] if c["type"] == kind]
    return str(found)


@pytest.mark.parametrize("kind", list(FAULTS))
def test_each_fault_type_has_its_severity_taint_condition_and_alert(kind: str) -> None:
    error_type, severity = FAULTS[kind]
    node = "us0-n1"
    event = fail(kind, node)
    if kind != "lost":
        assert severity_of(error_type) == severity
        assert getattr(event, "severity", None) == severity
        health = node_conditions({DEVICE: (Fault(error_type=error_type, source="kernel"),)})
        assert health["NeuronHealth"][:2] == ("True", f"NeuronHasError_{error_type}")
    taints = HealthTaints()
    key = NODE_LOST_KEY if kind == "lost" else HARDWARE_ERROR_KEY
    assert taints_of(event, node, taints) == {(key, EFFECT[severity])}
    [alert] = evaluate(event, {})
    assert (alert.status, alert.alertname, alert.labels["severity"]) == (
        "firing",
        *ALERT[severity],
    )
    fixed = repair(kind, node)
    assert taints_of(fixed, node, taints) == set()
    [resolved] = evaluate(fixed, {})
    assert (resolved.status, resolved.key) == ("resolved", alert.key)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("kind", list(FAULTS))
def test_each_strategy_meets_each_fault_and_recovers_after_the_repair(
    kind: str, strategy: str
) -> None:
    _, severity = FAULTS[kind]
    world = World(3, size=4, count=1, strategy=strategy)
    world.reconcile()
    before = world.nodes()
    victim = before[1]
    apply(world, fail(kind, victim))
    world.reconcile()
    status = world.status
    if severity == "degraded":
        # Usable: no new claims on the device, but the workload keeps its nodes.
        assert (status["state"], world.nodes()) == ("Allocated", before)
        assert "NodeFailed" not in world.reasons()
        assert condition(world, "Ready") == "True"
    elif strategy == "NoOp":
        assert (status["state"], world.nodes()) == ("PartiallyAllocated", before)
        assert condition(world, "Degraded") == "True"
        assert victim in status["message"]
    elif strategy == "RestartAll":
        assert status["state"] == "Pending"
        world.reconcile()
        assert world.status["state"] == "Allocated"
        assert set(world.nodes()).isdisjoint(before)
    else:
        assert world.status["state"] == "Allocated", status["message"]
        assert set(world.nodes()).isdisjoint(before)
        assert "Replaced" in world.reasons()
    if severity != "degraded":
        (failed,) = [e["message"] for e in world.api.events if e["reason"] == "NodeFailed"]
        assert victim in failed
        assert f"failureStrategy {strategy}" in failed, failed
        want = "lost" if kind == "lost" else f"{DEVICE} uncorrectable {FAULTS[kind][0]}"
        assert want in failed, failed
    moved_to = world.nodes()

    apply(world, repair(kind, victim))
    world.reconcile()
    status = world.status
    assert status["state"] == "Allocated", status["message"]
    assert condition(world, "Ready") == "True"
    # Where it ran on after the fault is where it stays: the repair moves nothing back.
    assert world.nodes() == moved_to
