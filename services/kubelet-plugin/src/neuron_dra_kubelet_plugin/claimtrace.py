"""A claim's prepare in the trace of the workload it was made for.

The UltraServer operator writes the W3C traceparent of its reconcile span into the
ResourceClaimTemplate it generates (annotation ``neuron.aws.com/traceparent``); the
resourceclaim controller copies the template's annotations onto every claim. When a claim
carries one, the plugin records, as children of that context:

``kube-scheduler allocate ResourceClaim``
    The scheduler's allocation. kube-scheduler makes no spans of its own, so this one is
    rebuilt from what the claim's status says: the allocated devices, and as its time the
    ``status.allocation.allocationTimestamp`` the 1.36 scheduler writes (second precision,
    a zero-length span at that instant). A 1.34 scheduler writes no timestamp: the span is
    then placed at the moment the plugin first read the allocation, and its attribute
    ``neuron.allocation.time_source`` says so. Attribute ``neuron.span.rebuilt`` is true on
    it, so nobody mistakes it for the scheduler's own telemetry.
``prepare ResourceClaim``
    The plugin's prepare, with links to the allocation span above and to the kubelet's call
    (its own trace, the gRPC server span), and ``write CDI spec`` as its child.

Both are recorded once per claim: a repeated prepare answered from the checkpoint records
nothing new.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Final

from neuron_dra_common.telemetry import (
    TRACEPARENT_ANNOTATION,
    context_from_traceparent,
    get_tracer,
    tracing_enabled,
)
from opentelemetry import context as otel_context
from opentelemetry import trace

from neuron_dra_kubelet_plugin.claims import Allocation, ResourceClaim

__all__ = [
    "ALLOCATION_SPAN",
    "CDI_SPAN",
    "PREPARE_SPAN",
    "allocation_time",
    "cdi_write_span",
    "prepare_span",
    "workload_context",
]

TRACER_NAME: Final = "neuron_dra_kubelet_plugin"
ALLOCATION_SPAN: Final = "kube-scheduler allocate ResourceClaim"
PREPARE_SPAN: Final = "prepare ResourceClaim"
CDI_SPAN: Final = "write CDI spec"


def workload_context(claim: ResourceClaim) -> otel_context.Context | None:
    """The trace context the claim's annotation names, or None (absent or not W3C)."""
    value = claim.metadata.annotations.get(TRACEPARENT_ANNOTATION, "")
    ctx = context_from_traceparent(value)
    if not trace.get_current_span(ctx).get_span_context().is_valid:
        return None
    return ctx


def allocation_time(allocation: Allocation, *, now_ns: int | None = None) -> tuple[int, str]:
    """When the scheduler allocated (unix ns) and where that instant comes from.

    >>> from neuron_dra_kubelet_plugin.claims import Allocation
    >>> allocation_time(Allocation(allocation_timestamp="2026-01-02T03:04:05Z"))
    (1767323045000000000, 'status.allocation.allocationTimestamp')
    >>> allocation_time(Allocation(), now_ns=7)
    (7, 'first read by the kubelet plugin')
    """
    stamp = allocation.allocation_timestamp
    if stamp:
        try:
            return int(datetime.fromisoformat(stamp).timestamp()) * 10**9, (
                "status.allocation.allocationTimestamp"
            )
        except ValueError:
            pass
    return (time.time_ns() if now_ns is None else now_ns), "first read by the kubelet plugin"


def _claim_attributes(claim: ResourceClaim) -> dict[str, str]:
    return {
        "k8s.namespace.name": claim.metadata.namespace,
        "k8s.resourceclaim.name": claim.metadata.name,
        "k8s.resourceclaim.uid": claim.metadata.uid,
    }


def _record_allocation(
    tracer: trace.Tracer, claim: ResourceClaim, parent: otel_context.Context
) -> trace.SpanContext | None:
    allocation = claim.status.allocation
    if allocation is None:
        return None
    at, source = allocation_time(allocation)
    span = tracer.start_span(
        ALLOCATION_SPAN,
        context=parent,
        start_time=at,
        attributes={
            **_claim_attributes(claim),
            "neuron.span.rebuilt": True,
            "neuron.allocation.time_source": source,
            "neuron.devices": [f"{r.pool}/{r.device}" for r in allocation.devices.results],
        },
    )
    span.end(end_time=at)
    return span.get_span_context()


def _recording(tracer: trace.Tracer | None) -> trace.Tracer | None:
    """``tracer`` if given (it always records), else the process's once tracing is on."""
    if tracer is not None:
        return tracer
    return get_tracer(TRACER_NAME) if tracing_enabled() else None


@contextlib.contextmanager
def prepare_span(claim: ResourceClaim, *, tracer: trace.Tracer | None = None) -> Iterator[None]:
    """Run the prepare of ``claim`` in its workload's trace (a no-op without tracing or
    without the annotation: the kubelet call's own span covers it then)."""
    recording = _recording(tracer)
    parent = workload_context(claim) if recording is not None else None
    if recording is None or parent is None:
        yield
        return
    tracer = recording
    links: list[trace.Link] = []
    allocation = _record_allocation(tracer, claim, parent)
    if allocation is not None:
        links.append(trace.Link(allocation, {"neuron.link": "scheduler allocation"}))
    caller = trace.get_current_span().get_span_context()
    if caller.is_valid:
        links.append(trace.Link(caller, {"neuron.link": "kubelet call"}))
    with tracer.start_as_current_span(
        PREPARE_SPAN, context=parent, links=links, attributes=_claim_attributes(claim)
    ):
        yield


def cdi_write_span(
    uid: str, *, tracer: trace.Tracer | None = None
) -> contextlib.AbstractContextManager[object]:
    """A span around writing the claim's CDI spec, under the current prepare span."""
    recording = _recording(tracer)
    if recording is None:
        return contextlib.nullcontext()
    return recording.start_as_current_span(CDI_SPAN, attributes={"k8s.resourceclaim.uid": uid})
