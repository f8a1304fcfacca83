"""What the kubelet shows in a pod's allocatedResourcesStatus comes from the health event."""

from __future__ import annotations

from neuron_dra_common.events import DeviceHealthChanged
from neuron_dra_kubelet_plugin.bushealth import BusHealth
from neuron_dra_kubelet_plugin.health import Health


def test_an_unhealthy_device_reports_severity_action_and_evidence() -> None:
    health = BusHealth(node="n1", pool="n1", devices=["neurondevice2", "neurondevice3"])
    assert health.apply(
        DeviceHealthChanged(
            node="n1",
            device="neurondevice2",
            health="Unhealthy",
            reason="HBM_UNCORRECTABLE_ERROR on neurondevice2: replace-instance",
            error_type="HBM_UNCORRECTABLE_ERROR",
            severity="uncorrectable",
            evidence="neuron2 mem_ecc_uncorrected total 0 -> 1",
            action="replace-instance",
        )
    )
    report = {r.device: r for r in health.snapshot()}["neurondevice2"]
    assert report.health is Health.UNHEALTHY
    assert report.message == (
        "uncorrectable: HBM_UNCORRECTABLE_ERROR on neurondevice2: replace-instance; "
        "evidence: neuron2 mem_ecc_uncorrected total 0 -> 1"
    )
    assert {r.device: r for r in health.snapshot()}["neurondevice3"].health is Health.HEALTHY
    assert health.apply(
        DeviceHealthChanged(node="n1", device="neurondevice2", health="Healthy", reason="no error")
    )
    report = {r.device: r for r in health.snapshot()}["neurondevice2"]
    assert (report.health, report.message) == (Health.HEALTHY, "no error")
