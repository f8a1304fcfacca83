"""W3C trace context over NATS headers, gRPC metadata and Kubernetes API calls."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence

from opentelemetry import context as otel_context
from opentelemetry.propagate import extract, inject

__all__ = [
    "extract_grpc_metadata",
    "extract_headers",
    "inject_grpc_metadata",
    "inject_headers",
    "kube_trace_headers",
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
