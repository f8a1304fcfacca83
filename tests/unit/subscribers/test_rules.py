"""The alert rules: which event fires or resolves which alert, with which labels."""

from __future__ import annotations

from datetime import UTC, datetime

from neuron_dra_alerts.rules import evaluate
from neuron_dra_common.events import (
    ClaimPrepared,
    DeviceHealthChanged,
    NodeLost,
    NodeRecovered,
    ObjectRef,
    WorkloadStateChanged,
)

NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)
TRAIN = ObjectRef(namespace="ml", name="train", uid="u1")


def test_uncorrectable_device_fires_critical_with_node_device_and_holder() -> None:
    event = DeviceHealthChanged(
        node="n1",
        device="neurondevice3",
        health="Unhealthy",
        error_type="SRAM_UNCORRECTABLE_ERROR",
        severity="uncorrectable",
        action="replace-instance",
    )
    [alert] = evaluate(event, {"n1": TRAIN})
    assert alert.status == "firing"
    assert alert.key == "NeuronDeviceUnhealthy/n1/neurondevice3"
    assert alert.labels == {
        "alertname": "NeuronDeviceUnhealthy",
        "severity": "critical",
        "node": "n1",
        "device": "neurondevice3",
        "workload": "train",
        "namespace": "ml",
    }
    assert "SRAM_UNCORRECTABLE_ERROR" in alert.annotations["summary"]
    assert "kubectl drain n1" in alert.annotations["runbook"]


def test_degraded_device_is_a_warning_with_the_repair_runbook() -> None:
    event = DeviceHealthChanged(
        node="n1",
        device="neurondevice0",
        health="Unhealthy",
        error_type="HBM_REPAIRABLE_ERROR",
        severity="degraded",
        action="reload-driver-or-reboot",
    )
    [alert] = evaluate(event, {})
    assert alert.labels["severity"] == "warning"
    assert "workload" not in alert.labels
    assert "reload the Neuron driver" in alert.annotations["runbook"]


def test_healthy_resolves_and_unknown_says_nothing() -> None:
    [resolved] = evaluate(DeviceHealthChanged(node="n1", device="d", health="Healthy"), {})
    assert (resolved.status, resolved.key) == ("resolved", "NeuronDeviceUnhealthy/n1/d")
    assert evaluate(DeviceHealthChanged(node="n1", device="d", health="Unknown"), {}) == []


def test_node_lost_fires_and_recovered_resolves_the_same_key() -> None:
    [lost] = evaluate(
        NodeLost(node="n2", last_heartbeat_at=None, detected_at=NOW, reason="no heartbeat"), {}
    )
    [back] = evaluate(NodeRecovered(node="n2", detected_at=NOW, lost_for_seconds=3.0), {})
    assert lost.status == "firing"
    assert lost.labels["severity"] == "critical"
    assert back.status == "resolved"
    assert back.key == lost.key


def test_workload_alerts_follow_its_state() -> None:
    def state(now: str, was: str) -> list[str]:
        event = WorkloadStateChanged(workload=TRAIN, state=now, previous=was)
        return [f"{d.status}:{d.labels.get('severity', '')}" for d in evaluate(event, {})]

    assert state("Failed", "Allocating") == ["firing:critical"]
    assert state("PartiallyAllocated", "Allocated") == ["firing:warning"]
    assert state("Pending", "Allocated") == ["firing:critical"]  # waiting for a replacement
    assert state("Pending", "") == []  # a new workload waiting is not a problem
    assert state("Allocating", "Pending") == []
    assert state("Allocated", "Pending") == ["resolved:"]
    assert state("Deallocating", "Allocated") == ["resolved:"]


def test_events_without_a_rule_touch_no_alert() -> None:
    event = ClaimPrepared(node="n1", claim=TRAIN, devices=("neurondevice0",))
    assert evaluate(event, {}) == []
