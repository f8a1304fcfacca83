"""Spans and counts around every claim operation."""

from __future__ import annotations

from pathlib import Path

import pytest
from neuron_dra_common.telemetry import REGISTRY
from neuron_dra_kubelet_plugin.checkpoint import CheckpointStore
from neuron_dra_kubelet_plugin.health import DeviceHealthReport, Health, StaticHealth
from neuron_dra_kubelet_plugin.observe import ObservedPreparer, count_unhealthy
from neuron_dra_kubelet_plugin.plan import PrepareError
from neuron_dra_kubelet_plugin.preparer import Effects, NodePreparer
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.unit.kubelet_plugin.support import MemoryClaims, make_claim, ref_of, trn2_node


def preparer(root: Path, claims: MemoryClaims) -> NodePreparer:
    effects = Effects(store=CheckpointStore(root / "checkpoint.json"), cdi_root=root / "cdi")
    inner = NodePreparer(node=trn2_node(), claims=claims, effects=effects, boot_id="b1")
    inner.recover()
    return inner


def count(operation: str, outcome: str) -> float:
    value = REGISTRY.get_sample_value(
        "neuron_dra_kubelet_plugin_operations_total", {"operation": operation, "outcome": outcome}
    )
    assert value is not None
    return value


async def test_a_recording_tracer_gets_a_span_per_claim_operation(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    good, bad = make_claim("u1", [0, 1]), make_claim("u2", [99])
    observed = ObservedPreparer(
        preparer(tmp_path, MemoryClaims([good, bad])), tracer=provider.get_tracer("t")
    )
    await observed.prepare(ref_of(good))
    with pytest.raises(PrepareError):
        await observed.prepare(ref_of(bad))
    await observed.unprepare(ref_of(good))
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["prepare claim", "prepare claim", "unprepare claim"]
    ok, failed, _ = spans
    assert ok.attributes is not None
    assert ok.attributes["k8s.resourceclaim.uid"] == "u1"
    assert ok.attributes["neuron.devices"] == ("neurondevice0", "neurondevice1")
    assert failed.status.status_code is trace.StatusCode.ERROR
    assert "neurondevice99" in (failed.status.description or "")


async def test_with_tracing_off_operations_are_still_counted(tmp_path: Path) -> None:
    claim = make_claim("u1", [3])
    observed = ObservedPreparer(preparer(tmp_path, MemoryClaims([claim])))
    before = count("prepare", "ok"), count("unprepare", "ok")
    devices = await observed.prepare(ref_of(claim))
    await observed.unprepare(ref_of(claim))
    assert [d.device for d in devices] == ["neurondevice3"]
    assert (count("prepare", "ok"), count("unprepare", "ok")) == (before[0] + 1, before[1] + 1)
    assert not trace.get_current_span().get_span_context().is_valid


def test_unhealthy_devices_are_read_from_the_health_source_at_each_scrape() -> None:
    health = StaticHealth(pool="n1", devices=["neurondevice0", "neurondevice1"])
    count_unhealthy(health)
    assert REGISTRY.get_sample_value("neuron_dra_unhealthy_devices") == 0.0
    health.update(
        DeviceHealthReport(
            pool="n1", device="neurondevice1", health=Health.UNHEALTHY, updated_at=1, message="x"
        )
    )
    assert REGISTRY.get_sample_value("neuron_dra_unhealthy_devices") == 1.0
