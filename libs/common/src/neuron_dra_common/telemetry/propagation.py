"""W3C trace context over NATS headers, gRPC metadata and Kubernetes API calls."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence

from opentelemetry import context as otel_context
from opentelemetry.propagate import extract, inject

from neuron_dra_common.driver import TRACEPARENT_ANNOTATION

__all__ = [
    "TRACEPARENT_ANNOTATION",
    "context_from_traceparent",
    "extract_grpc_metadata",
    "extract_headers",
    "inject_grpc_metadata",
    "inject_headers",
    "kube_trace_headers",
    "traceparent_of",
]


def inject_headers(
    headers: MutableMapping[str, str], ctx: otel_context.Context | None = None
) -> MutableMapping[str, str]:
    """Add ``traceparent`` (and ``tracestate``) of ``ctx`` or the current span to ``headers``."""
    inject(headers, context=ctx)
    return headers


def extract_headers(headers: Mapping[str, str] | None) -> otel_context.Context:
    """The trace context carried by message headers (an empty context when there is none)."""
    return extract(headers or {})


def inject_grpc_metadata(
    metadata: Sequence[tuple[str, str]] = (), ctx: otel_context.Context | None = None
) -> list[tuple[str, str]]:
    """gRPC metadata with the trace context appended (gRPC keys are lower case already)."""
    carrier: dict[str, str] = {}
    inject(carrier, context=ctx)
    return [*metadata, *carrier.items()]


def extract_grpc_metadata(
    metadata: Sequence[tuple[str, str | bytes]] | None,
) -> otel_context.Context:
    """The trace context carried by incoming gRPC invocation metadata."""
    carrier = {k.lower(): v for k, v in (metadata or ()) if isinstance(v, str)}
    return extract(carrier)


def kube_trace_headers(ctx: otel_context.Context | None = None) -> dict[str, str]:
    """Headers to send with a Kubernetes API call so the apiserver joins the trace.

    The apiserver reads W3C ``traceparent`` when its APIServerTracing feature is on.
    """
    carrier: dict[str, str] = {}
    inject(carrier, context=ctx)
    return carrier


def context_from_traceparent(value: str | None) -> otel_context.Context:
    """The trace context a W3C ``traceparent`` value names (empty when absent or invalid).

    >>> from opentelemetry import trace
    >>> ctx = context_from_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    >>> format(trace.get_current_span(ctx).get_span_context().trace_id, "032x")
    '0af7651916cd43dd8448eb211c80319c'
    """
    if not value:
        return otel_context.Context()
    return extract({"traceparent": value.strip()})


def traceparent_of(ctx: otel_context.Context | None = None) -> str:
    """The W3C ``traceparent`` of ``ctx`` or the current span (``""`` when there is none)."""
    carrier: dict[str, str] = {}
    inject(carrier, context=ctx)
    return carrier.get("traceparent", "")
