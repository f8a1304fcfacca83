"""OpenTelemetry tracer setup: OTLP export when an endpoint is given, nothing otherwise."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

__all__ = ["configure_tracing", "get_tracer", "shutdown_tracing", "tracing_enabled"]

INSTRUMENTATION = "neuron_dra_common"

#: Whether an SDK provider is installed: set by :func:`configure_tracing`, or found by the
#: first :func:`tracing_enabled` call (``None`` until then).
_enabled: bool | None = None


def configure_tracing(
    *, service: str, otlp_endpoint: str = "", exporter: SpanExporter | None = None
) -> TracerProvider | None:
    """Install a tracer provider for the process and return it.

    With neither ``otlp_endpoint`` nor ``exporter`` nothing is installed, so spans stay
    no-ops and cost next to nothing; trace context is still propagated.
    """
    if not otlp_endpoint and exporter is None:
        return None
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    if exporter is None:
        # Imported here so a service without an endpoint never loads gRPC.
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=otlp_endpoint)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    global _enabled
    _enabled = isinstance(trace.get_tracer_provider(), TracerProvider)
    return provider


def get_tracer(name: str = INSTRUMENTATION) -> trace.Tracer:
    """The tracer for ``name`` from whatever provider is installed (possibly a no-op)."""
    return trace.get_tracer(name)


def shutdown_tracing() -> None:
    """Flush and stop the installed provider, if it is an SDK one."""
    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider):
        provider.shutdown()


def tracing_enabled() -> bool:
    """Whether spans are recorded and exported (an SDK provider is installed).

    When not, hot paths skip making spans and only carry the caller's trace context on.
    Asked on every gRPC call and claim operation, so the answer is kept: a process installs
    its provider once, at start (:func:`configure_tracing`), before it serves anything.
    """
    global _enabled
    if _enabled is None:
        _enabled = isinstance(trace.get_tracer_provider(), TracerProvider)
    return _enabled
