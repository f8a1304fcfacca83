"""Every metric the services define follows one naming scheme a platform team can rely on."""

from __future__ import annotations

import importlib

import pytest
from neuron_dra_common.telemetry.registry import Counter, Gauge, Histogram

#: The modules that define the product's metrics.
MODULES = (
    "neuron_dra_common.telemetry.metrics",
    "neuron_dra_common.kube.metrics",
    "neuron_dra_kubelet_plugin.observe",
    "neuron_dra_slice_publisher.controller",
    "neuron_dra_topology_allocator.allocator",
    "neuron_dra_common.bus.metrics",
    "neuron_dra_ultraserver_operator.metrics",
)
KINDS = (Counter, Gauge, Histogram)
Metric = Counter | Gauge | Histogram


def product_metrics() -> list[Metric]:
    """The metrics each module defines at its top level."""
    found: list[Metric] = []
    for name in MODULES:
        for value in vars(importlib.import_module(name)).values():
            if isinstance(value, KINDS):
                found.append(value)
    return found


def test_the_modules_define_metrics() -> None:
    names = {m.name for m in product_metrics()}
    assert {"neuron_dra_build_info", "neuron_dra_unhealthy_devices", "neuron_dra_leader"} <= names


@pytest.mark.parametrize("metric", product_metrics(), ids=lambda m: m.name)
def test_name_prefix_and_unit(metric: Metric) -> None:
    # neuron_* alone is what AWS's neuron-monitor exports.
    assert metric.name.startswith("neuron_dra_")
    if metric.kind == "counter":
        assert metric.exposed_name.endswith("_total"), metric.exposed_name
    if metric.kind == "histogram":
        assert metric.name.endswith(("_seconds", "_bytes")), metric.name
