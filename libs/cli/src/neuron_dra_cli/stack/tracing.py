"""The trace backend of the local stack (``neuron-dra dev up --tracing``): Jaeger v2.

One process, in-memory storage, every port on 127.0.0.1 and free: OTLP gRPC and HTTP for the
services' spans, the query API and UI (``http://127.0.0.1:<ui>/``), and its health check.
Services started after it send their spans there through ``OTEL_EXPORTER_OTLP_ENDPOINT``
(see :func:`otlp_env`).
"""

from __future__ import annotations

from pathlib import Path

from neuron_dra_cli.stack import probes, process
from neuron_dra_cli.stack.components import Component

__all__ = ["JAEGER", "jaeger", "otlp_env", "ui_url"]

JAEGER = "jaeger"

_CONFIG = """\
# Written by neuron-dra dev up --tracing: Jaeger with in-memory storage on loopback ports.
service:
  extensions: [jaeger_storage, jaeger_query, healthcheckv2]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  healthcheckv2:
    use_v2: true
    http:
      endpoint: 127.0.0.1:{health}
  jaeger_query:
    storage:
      traces: memstore
    http:
      endpoint: 127.0.0.1:{ui}
    grpc:
      endpoint: 127.0.0.1:{query_grpc}
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 100000
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:{otlp_grpc}
      http:
        endpoint: 127.0.0.1:{otlp_http}
processors:
  batch:
    timeout: 200ms
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
"""


def jaeger(*, binary: Path, state_dir: Path) -> Component:
    """Jaeger on free loopback ports; its config is written under ``state_dir/jaeger``."""
    ports = {
        name: process.free_port()
        for name in ("otlp_grpc", "otlp_http", "ui", "query_grpc", "health")
    }
    config = state_dir / JAEGER / "config.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(_CONFIG.format(**ports))
    return Component(
        name=JAEGER,
        kind=JAEGER,
        argv=[str(binary), "--config", str(config)],
        ports=ports,
        ready=lambda: (
            probes.tcp_open(ports["otlp_grpc"])
            and probes.http_ok(f"http://127.0.0.1:{ports['ui']}/api/services")
        ),
    )


def otlp_env(ports: dict[str, int]) -> dict[str, str]:
    """What points a service at this Jaeger (the standard OpenTelemetry variables)."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{ports['otlp_grpc']}",
        # A span a second after it ends, not five: the stack is for looking at traces.
        "OTEL_BSP_SCHEDULE_DELAY": "1000",
    }


def ui_url(ports: dict[str, int]) -> str:
    """The Jaeger UI (and query API, under ``/api``)."""
    return f"http://127.0.0.1:{ports['ui']}/"
