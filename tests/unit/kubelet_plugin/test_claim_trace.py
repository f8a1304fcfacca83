"""A claim made for a workload is prepared in the workload's trace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from neuron_dra_common.telemetry import TRACEPARENT_ANNOTATION
from neuron_dra_kubelet_plugin.checkpoint import CheckpointStore
from neuron_dra_kubelet_plugin.claims import claim_from_api
from neuron_dra_kubelet_plugin.claimtrace import ALLOCATION_SPAN, CDI_SPAN, PREPARE_SPAN
from neuron_dra_kubelet_plugin.plan import PrepareError
from neuron_dra_kubelet_plugin.preparer import Effects, NodePreparer
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.unit.kubelet_plugin.support import (
    NODE,
    MemoryClaims,
    claim_json,
    ref_of,
    trn2_node,
)

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


def claim(uid: str, devices: list[int], *, annotations: dict[str, str], **status: Any) -> Any:
    obj = claim_json(uid, devices)
    obj["metadata"]["annotations"] = annotations
    obj["status"]["allocation"].update(status)
    return claim_from_api(obj)


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


def preparer(root: Path, claims: MemoryClaims, exporter: InMemorySpanExporter) -> NodePreparer:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    effects = Effects(store=CheckpointStore(root / "checkpoint.json"), cdi_root=root / "cdi")
    p = NodePreparer(
        node=trn2_node(),
        claims=claims,
        effects=effects,
        boot_id="b1",
        tracer=provider.get_tracer("test"),
    )
    p.recover()
    return p


def by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    return {s.name: s for s in spans}


def hex_ids(span: ReadableSpan) -> tuple[str, str]:
    ctx = span.get_span_context()
    assert ctx is not None
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


async def test_prepare_is_a_child_of_the_annotation_with_the_cdi_write_under_it(
    tmp_path: Path, exporter: InMemorySpanExporter
) -> None:
    c = claim(
        "u1",
        [0, 1],
        annotations={TRACEPARENT_ANNOTATION: TRACEPARENT},
        allocationTimestamp="2026-11-25T10:00:00Z",
    )
    p = preparer(tmp_path, MemoryClaims([c]), exporter)
    await p.prepare(ref_of(c))
    spans = by_name(exporter.get_finished_spans())
    assert set(spans) == {ALLOCATION_SPAN, PREPARE_SPAN, CDI_SPAN}
    prepare, cdi, allocation = spans[PREPARE_SPAN], spans[CDI_SPAN], spans[ALLOCATION_SPAN]
    for span in spans.values():
        assert hex_ids(span)[0] == TRACE_ID
    assert prepare.parent is not None
    assert format(prepare.parent.span_id, "016x") == PARENT_ID
    assert allocation.parent is not None
    assert format(allocation.parent.span_id, "016x") == PARENT_ID
    assert cdi.parent is not None
    assert format(cdi.parent.span_id, "016x") == hex_ids(prepare)[1]
    # The scheduler's allocation: a link from prepare, at the instant the status names.
    assert [hex_ids_of(link.context) for link in prepare.links] == [hex_ids(allocation)]
    assert allocation.start_time == allocation.end_time == 1795600800 * 10**9
    assert allocation.attributes is not None
    assert allocation.attributes["neuron.span.rebuilt"] is True
    assert allocation.attributes["neuron.allocation.time_source"] == (
        "status.allocation.allocationTimestamp"
    )
    assert allocation.attributes["neuron.devices"] == (
        f"{NODE}/neurondevice0",
        f"{NODE}/neurondevice1",
    )


def hex_ids_of(ctx: trace.SpanContext) -> tuple[str, str]:
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


async def test_a_repeated_prepare_records_nothing_new(
    tmp_path: Path, exporter: InMemorySpanExporter
) -> None:
    c = claim("u1", [2], annotations={TRACEPARENT_ANNOTATION: TRACEPARENT})
    p = preparer(tmp_path, MemoryClaims([c]), exporter)
    await p.prepare(ref_of(c))
    first = len(exporter.get_finished_spans())
    await p.prepare(ref_of(c))
    assert len(exporter.get_finished_spans()) == first == 3
    # A 1.34 scheduler writes no allocation time: the span says where its time comes from.
    allocation = by_name(exporter.get_finished_spans())[ALLOCATION_SPAN]
    assert allocation.attributes is not None
    assert allocation.attributes["neuron.allocation.time_source"] == (
        "first read by the kubelet plugin"
    )


async def test_a_failed_prepare_is_an_error_in_the_workloads_trace(
    tmp_path: Path, exporter: InMemorySpanExporter
) -> None:
    c = claim("u1", [99], annotations={TRACEPARENT_ANNOTATION: TRACEPARENT})
    p = preparer(tmp_path, MemoryClaims([c]), exporter)
    with pytest.raises(PrepareError):
        await p.prepare(ref_of(c))
    prepare = by_name(exporter.get_finished_spans())[PREPARE_SPAN]
    assert prepare.status.status_code is trace.StatusCode.ERROR
    assert CDI_SPAN not in by_name(exporter.get_finished_spans())


@pytest.mark.parametrize("annotations", [{}, {TRACEPARENT_ANNOTATION: "not-a-traceparent"}])
async def test_a_claim_without_a_workload_trace_gets_only_the_cdi_span(
    tmp_path: Path, exporter: InMemorySpanExporter, annotations: dict[str, str]
) -> None:
    c = claim("u1", [3], annotations=annotations)
    p = preparer(tmp_path, MemoryClaims([c]), exporter)
    await p.prepare(ref_of(c))
    [cdi] = exporter.get_finished_spans()
    assert cdi.name == CDI_SPAN
    assert hex_ids(cdi)[0] != TRACE_ID
