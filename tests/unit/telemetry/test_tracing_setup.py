"""Which endpoint, resource and sampler a service's spans get from the environment."""

from __future__ import annotations

import pytest
from neuron_dra_common.telemetry import REGISTRY, metrics
from neuron_dra_common.telemetry.tracing import (
    otlp_endpoint_from,
    service_resource,
    service_version,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ParentBased


def test_the_standard_endpoint_alone_turns_export_on() -> None:
    assert otlp_endpoint_from({}) == ""
    assert otlp_endpoint_from({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}) == "http://c:4317"


def test_the_traces_endpoint_wins_over_the_general_one_and_the_alias_over_both() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://general:4317",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://traces:4317",
    }
    assert otlp_endpoint_from(env) == "http://traces:4317"
    assert otlp_endpoint_from(env, "http://alias:4317") == "http://alias:4317"


@pytest.mark.parametrize("off", [{"OTEL_SDK_DISABLED": "true"}, {"OTEL_TRACES_EXPORTER": "none"}])
def test_the_sdk_switches_turn_export_off(off: dict[str, str]) -> None:
    assert otlp_endpoint_from({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", **off}) == ""
    assert otlp_endpoint_from(off, "http://alias:4317") == ""


def test_resource_names_the_service_product_version_node_and_pod(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"):
        monkeypatch.delenv(name, raising=False)
    attrs = service_resource(
        "kubelet-plugin",
        {
            "NEURON_DRA_NODE_NAME": "trn2-0",
            "K8S_POD_NAME": "neuron-dra-kubelet-plugin-x7",
            "K8S_POD_NAMESPACE": "neuron-dra-driver",
        },
    ).attributes
    assert attrs["service.name"] == "kubelet-plugin"
    assert attrs["service.namespace"] == "neuron-dra"
    assert attrs["service.version"] == service_version("kubelet-plugin") != "0.0.0"
    assert attrs["k8s.node.name"] == "trn2-0"
    assert attrs["k8s.pod.name"] == "neuron-dra-kubelet-plugin-x7"
    assert attrs["k8s.namespace.name"] == "neuron-dra-driver"
    # Nothing is invented where the environment says nothing.
    assert "k8s.pod.name" not in service_resource("slice-publisher", {}).attributes


def test_otel_variables_override_the_products_attributes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "publisher-eu-1")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod,k8s.node.name=n9")
    attrs = service_resource("slice-publisher", {"K8S_NODE_NAME": "n1"}).attributes
    assert attrs["service.name"] == "publisher-eu-1"
    assert attrs["deployment.environment"] == "prod"
    assert attrs["k8s.node.name"] == "n9"
    assert attrs["service.namespace"] == "neuron-dra"


def test_the_sampler_comes_from_otel_traces_sampler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.25")
    # configure_tracing builds its provider without a sampler, so the SDK's reading applies.
    sampler = TracerProvider(resource=service_resource("discovery", {})).sampler
    assert isinstance(sampler, ParentBased)
    assert "root:TraceIdRatioBased{0.25}" in sampler.get_description()  # type: ignore[no-untyped-call]


def test_build_info_names_service_and_version() -> None:
    metrics.publish_build_info("topology-allocator")
    labels = {
        "service": "topology-allocator",
        "version": service_version("topology-allocator"),
        "python_version": __import__("platform").python_version(),
    }
    assert REGISTRY.get_sample_value("neuron_dra_build_info", labels) == 1.0
