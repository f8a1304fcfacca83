"""Structured logs with trace ids, OpenTelemetry setup, trace propagation helpers, and
metrics: the one place prometheus_client is imported (services make their metrics with the
:class:`Counter`, :class:`Gauge` and :class:`Histogram` re-exported here)."""

from neuron_dra_common.telemetry.logs import JsonFormatter, configure_logging
from neuron_dra_common.telemetry.metrics import (
    BUILD_INFO,
    CONTENT_TYPE,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    expose,
    publish_build_info,
)
from neuron_dra_common.telemetry.propagation import (
    TRACEPARENT_ANNOTATION,
    context_from_traceparent,
    extract_grpc_metadata,
    extract_headers,
    inject_grpc_metadata,
    inject_headers,
    kube_trace_headers,
    traceparent_of,
)
from neuron_dra_common.telemetry.tracing import (
    SERVICE_NAMESPACE,
    configure_tracing,
    get_tracer,
    service_resource,
    service_version,
    shutdown_tracing,
    tracing_enabled,
)

__all__ = [
    "BUILD_INFO",
    "CONTENT_TYPE",
    "REGISTRY",
    "SERVICE_NAMESPACE",
    "TRACEPARENT_ANNOTATION",
    "CollectorRegistry",
    "Counter",
    "Gauge",
    "Histogram",
    "JsonFormatter",
    "configure_logging",
    "configure_tracing",
    "context_from_traceparent",
    "expose",
    "extract_grpc_metadata",
    "extract_headers",
    "get_tracer",
    "inject_grpc_metadata",
    "inject_headers",
    "kube_trace_headers",
    "publish_build_info",
    "service_resource",
    "service_version",
    "shutdown_tracing",
    "traceparent_of",
    "tracing_enabled",
]
