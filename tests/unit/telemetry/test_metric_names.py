"""Every metric the services define follows one naming scheme a platform team can rely on."""

from __future__ import annotations

import importlib

import pytest
from neuron_dra_common.telemetry import Counter, Gauge, Histogram

#: The modules that define the product's metrics.
MODULES = (
    "neuron_dra_common.telemetry.metrics",
    "neuron_dra_common.kube.metrics",
    "neuron_dra_common.bus.metrics",
    "neuron_dra_kubelet_plugin.observe",
    "neuron_dra_slice_publisher.controller",
    "neuron_dra_topology_allocator.allocator",
    "neuron_dra_ultraserver_operator.metrics",
    "neuron_dra_scheduler_extender.extender",
    "neuron_dra_alerts.engine",
    "neuron_dra_audit.writer",
    "neuron_dra_health_monitor.probe",
)
KINDS = (Counter, Gauge, Histogram)


def product_metrics() -> list[tuple[str, str]]:
    """(name, type) of each metric the modules define at their top level, as scraped."""
    found: list[tuple[str, str]] = []
    for module in MODULES:
        for value in vars(importlib.import_module(module)).values():
            if isinstance(value, KINDS):
                (family,) = value.describe()
                found.append((family.name, family.type))
    return found


def test_the_modules_define_metrics() -> None:
    names = {name for name, _ in product_metrics()}
    assert {
        "neuron_dra_build_info",
        "neuron_dra_unhealthy_devices",
        "neuron_dra_leader",
        "neuron_dra_extender_decisions",
        "neuron_dra_bus_messages",
    } <= names


@pytest.mark.parametrize(("name", "kind"), product_metrics(), ids=str)
def test_name_prefix_and_unit(name: str, kind: str) -> None:
    # neuron_* alone is what AWS's neuron-monitor exports.
    assert name.startswith("neuron_dra_")
    # A counter is scraped as <name>_total, whether or not its definition says so.
    if kind == "histogram":
        assert name.endswith(("_seconds", "_bytes")), name
