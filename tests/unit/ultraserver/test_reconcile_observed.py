"""What a platform team sees of a workload's reconcile: one trace per allocation, whose
context the allocation carries to the components that act on it, and the operator's metrics."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from neuron_dra_common.events import AllocationRequested, Event
from neuron_dra_common.kube import WorkQueue
from neuron_dra_common.telemetry import REGISTRY
from neuron_dra_ultraserver_operator.fleet import Fleet, FleetIndex
from neuron_dra_ultraserver_operator.model import TRACEPARENT
from neuron_dra_ultraserver_operator.reconciler import SPAN_NAME
from neuron_dra_ultraserver_operator.triggers import Triggers
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.unit.ultraserver.memory_api import KEY, World

Obj = dict[str, Any]


def sample(name: str, **labels: str) -> float:
    value = REGISTRY.get_sample_value(name, labels)
    return float(value or 0.0)


def test_an_allocation_is_one_trace_rooted_at_the_reconcile() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    asked_in: list[trace.SpanContext] = []

    def on_allocate(event: Event) -> None:
        if isinstance(event, AllocationRequested):
            asked_in.append(trace.get_current_span().get_span_context())

    world = World(
        2,
        size=4,
        count=1,
        strategy="NoOp",
        tracer=provider.get_tracer("t"),
        on_allocate=on_allocate,
    )
    world.reconcile()
    assert world.status["state"] == "Allocated"
    (span,) = exporter.get_finished_spans()
    assert span.name == SPAN_NAME
    assert span.parent is None
    assert dict(span.attributes or {}) == {
        "k8s.namespace.name": "ml",
        "neuron.workload.name": "train",
    }
    context = span.get_span_context()
    assert context is not None
    # The allocator was asked inside the reconcile's span (the bus carries it on).
    assert [c.span_id for c in asked_in] == [context.span_id]
    flags = int(context.trace_flags)
    traceparent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{flags:02x}"
    template = world.api.templates["train"]
    assert template["spec"]["metadata"]["annotations"] == {TRACEPARENT: traceparent}
    for node in world.nodes():
        assert world.api.nodes[node]["metadata"]["annotations"][TRACEPARENT] == traceparent

    # The next pass is a trace of its own; the allocation keeps the trace that made it.
    world.reconcile()
    assert len({s.context.trace_id for s in exporter.get_finished_spans()}) == 2
    assert world.api.templates["train"]["spec"]["metadata"]["annotations"] == {
        TRACEPARENT: traceparent
    }


def test_without_a_recording_tracer_nothing_is_annotated() -> None:
    world = World(2, size=4, count=1, strategy="NoOp")
    world.reconcile()
    assert "annotations" not in world.api.templates["train"]["spec"]["metadata"]
    assert all(
        TRACEPARENT not in world.api.nodes[n]["metadata"]["annotations"] for n in world.nodes()
    )


def test_the_first_allocation_is_timed_and_a_failed_reconcile_counted() -> None:
    gone: list[bool] = []

    def on_allocate(event: Event) -> None:
        if gone:
            raise TimeoutError("no allocator answered")

    world = World(2, size=4, count=1, strategy="NoOp", on_allocate=on_allocate)
    world.api.workloads[KEY]["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    timed = sample("neuron_dra_operator_allocation_seconds_count")
    world.reconcile()
    world.reconcile()  # already Allocated: not timed again
    assert sample("neuron_dra_operator_allocation_seconds_count") == timed + 1

    gone.append(True)
    errors = sample("neuron_dra_operator_reconcile_errors_total")
    with pytest.raises(TimeoutError):
        world.reconcile()
    assert sample("neuron_dra_operator_reconcile_errors_total") == errors + 1


def test_workloads_are_counted_by_state() -> None:
    async def scenario() -> None:
        fleet = Fleet({}, {})
        triggers = Triggers(
            workloads={},
            fleet=fleet,
            index=FleetIndex(fleet, {}),
            workload_queue=WorkQueue(name="w"),
            ultraserver_queue=WorkQueue(name="u"),
        )

        def workload(name: str, state: str | None) -> Obj:
            obj: Obj = {"metadata": {"name": name, "namespace": "ml"}}
            if state is not None:
                obj["status"] = {"state": state}
            return obj

        triggers.on_workload("ADDED", workload("a", None))
        triggers.on_workload("ADDED", workload("b", "Allocated"))
        triggers.on_workload("ADDED", workload("c", "Allocated"))
        assert sample("neuron_dra_operator_workloads", state="Pending") == 1
        assert sample("neuron_dra_operator_workloads", state="Allocated") == 2
        triggers.on_workload("MODIFIED", workload("a", "Allocated"))
        triggers.on_workload("DELETED", workload("b", "Allocated"))
        assert sample("neuron_dra_operator_workloads", state="Pending") == 0
        assert sample("neuron_dra_operator_workloads", state="Allocated") == 2
        assert sample("neuron_dra_operator_workloads", state="Failed") == 0

    asyncio.run(scenario())
