"""Structured logs with trace ids, OpenTelemetry setup, and trace propagation helpers."""

from neuron_dra_common.telemetry.logs import JsonFormatter, configure_logging
from neuron_dra_common.telemetry.propagation import (
    extract_grpc_metadata,
    extract_headers,
    inject_grpc_metadata,
    inject_headers,
    kube_trace_headers,
)
from neuron_dra_common.telemetry.tracing import (
    configure_tracing,
    get_tracer,
    shutdown_tracing,
    tracing_enabled,
)

__all__ = [
    "JsonFormatter",
    "configure_logging",
    "configure_tracing",
    "extract_grpc_metadata",
    "extract_headers",
    "get_tracer",
    "inject_grpc_metadata",
    "inject_headers",
    "kube_trace_headers",
    "shutdown_tracing",
    "tracing_enabled",
]
