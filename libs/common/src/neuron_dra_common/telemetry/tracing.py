"""OpenTelemetry tracer setup from the standard ``OTEL_*`` variables.

Export is on when an OTLP endpoint is known: ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``,
``OTEL_EXPORTER_OTLP_ENDPOINT`` or the product's own ``NEURON_DRA_OTLP_ENDPOINT`` (an alias
kept for existing deployments; it wins when set). Everything else the OpenTelemetry SDK
documents applies unchanged: ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` override
the resource attributes set here, ``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG`` pick
the sampler, ``OTEL_EXPORTER_OTLP_*_HEADERS`` / ``_INSECURE`` / ``_TIMEOUT`` configure the
exporter, ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none`` turn export off.

Every span carries the resource ``service.name`` (the service), ``service.namespace``
(``neuron-dra``), ``service.version`` (the installed package's version) and, where the
manifests pass them from the downward API, ``k8s.node.name``, ``k8s.pod.name`` and
``k8s.namespace.name``.

The SDK is loaded only when export is on: a process without an endpoint (every node agent
by default) keeps only the API, whose spans are no-ops, and saves the SDK's memory and import
time.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Final, TypeGuard

from opentelemetry import trace

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

__all__ = [
    "SERVICE_NAMESPACE",
    "configure_tracing",
    "get_tracer",
    "otlp_endpoint_from",
    "service_resource",
    "service_version",
    "shutdown_tracing",
    "tracing_enabled",
]

INSTRUMENTATION = "neuron_dra_common"
SERVICE_NAMESPACE: Final = "neuron-dra"

#: Resource attribute <- the environment variables that may carry it, first set wins.
#: ``NEURON_DRA_NODE_NAME`` is what the node agents are configured with already; the
#: ``K8S_*`` names are what the manifests set from the downward API for every service.
_FROM_ENV: Final = {
    "k8s.node.name": ("K8S_NODE_NAME", "NEURON_DRA_NODE_NAME"),
    "k8s.pod.name": ("K8S_POD_NAME",),
    "k8s.namespace.name": ("K8S_POD_NAMESPACE",),
    "k8s.pod.uid": ("K8S_POD_UID",),
}

#: Whether an SDK provider is installed: set by :func:`configure_tracing`, or found by the
#: first :func:`tracing_enabled` call (``None`` until then).
_enabled: bool | None = None


def service_version(service: str) -> str:
    """The installed version of the service's package (``neuron-dra-<service>``), else of
    ``neuron-dra-common``; ``0.0.0`` from a source tree without package metadata."""
    for dist in (f"neuron-dra-{service}", "neuron-dra-common"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return "0.0.0"


def otlp_endpoint_from(environ: Mapping[str, str], explicit: str = "") -> str:
    """The OTLP endpoint traces go to, or ``""`` when export is off.

    >>> otlp_endpoint_from({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"})
    'http://collector:4317'
    >>> otlp_endpoint_from({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_SDK_DISABLED": "true"})
    ''
    """
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return ""
    if environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return ""
    return (
        explicit
        or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
        or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")
    ).strip()


def service_resource(service: str, environ: Mapping[str, str] | None = None) -> Resource:
    """The resource of ``service``'s spans: this product's attributes, then the SDK's own
    ``OTEL_RESOURCE_ATTRIBUTES`` / ``OTEL_SERVICE_NAME`` on top (the operator's word wins)."""
    from opentelemetry.sdk.resources import OTELResourceDetector, Resource

    env = os.environ if environ is None else environ
    attributes: dict[str, str] = {
        "service.name": service,
        "service.namespace": SERVICE_NAMESPACE,
        "service.version": service_version(service),
    }
    for key, names in _FROM_ENV.items():
        for name in names:
            value = env.get(name, "").strip()
            if value:
                attributes[key] = value
                break
    return Resource.create(attributes).merge(OTELResourceDetector().detect())


def configure_tracing(
    *, service: str, otlp_endpoint: str = "", exporter: SpanExporter | None = None
) -> TracerProvider | None:
    """Install a tracer provider for the process and return it.

    ``otlp_endpoint`` is ``NEURON_DRA_OTLP_ENDPOINT``; without it the standard ``OTEL_*``
    variables decide (see the module's text). With no endpoint and no ``exporter`` nothing is
    installed, so spans stay no-ops and cost next to nothing; trace context still propagates.
    """
    endpoint = otlp_endpoint_from(os.environ, otlp_endpoint)
    if not endpoint and exporter is None:
        return None
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # The sampler comes from OTEL_TRACES_SAMPLER(_ARG) when no sampler is passed.
    provider = TracerProvider(resource=service_resource(service))
    if exporter is None:
        # Imported here so a service without an endpoint never loads gRPC.
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        # Without an argument the exporter reads the OTEL_EXPORTER_OTLP_* variables itself
        # (endpoint, headers, insecure, timeout), exactly as the SDK documents.
        exporter = OTLPSpanExporter(endpoint=otlp_endpoint) if otlp_endpoint else OTLPSpanExporter()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    global _enabled
    _enabled = _is_sdk_provider(trace.get_tracer_provider())
    return provider


def get_tracer(name: str = INSTRUMENTATION) -> trace.Tracer:
    """The tracer for ``name`` from whatever provider is installed (possibly a no-op)."""
    return trace.get_tracer(name)


def shutdown_tracing() -> None:
    """Flush and stop the installed provider, if it is an SDK one."""
    provider = trace.get_tracer_provider()
    if _is_sdk_provider(provider):
        provider.shutdown()


def tracing_enabled() -> bool:
    """Whether spans are recorded and exported (an SDK provider is installed).

    When not, hot paths skip making spans and only carry the caller's trace context on.
    Asked on every gRPC call and claim operation, so the answer is kept: a process installs
    its provider once, at start (:func:`configure_tracing`), before it serves anything.
    """
    global _enabled
    if _enabled is None:
        _enabled = _is_sdk_provider(trace.get_tracer_provider())
    return _enabled


def _is_sdk_provider(provider: trace.TracerProvider) -> TypeGuard[TracerProvider]:
    """Whether ``provider`` is the SDK's (which records spans). An SDK provider exists only
    once the SDK was imported, so a process that never loaded it is answered without it."""
    sdk = sys.modules.get("opentelemetry.sdk.trace")
    return sdk is not None and isinstance(provider, sdk.TracerProvider)
