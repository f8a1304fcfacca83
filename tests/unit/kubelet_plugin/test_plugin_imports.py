"""A node agent loads only what it uses: what its start imports, seen from a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

# Imports what the plugin's entry point imports before it serves, then sets tracing up the
# way the runtime does; prints the top-level modules loaded and whether spans are recorded.
_START = """
import json, os, sys
from neuron_dra_common.runtime.process import run
from neuron_dra_common.telemetry.tracing import configure_tracing, tracing_enabled
from neuron_dra_kubelet_plugin.wiring import build, node_context
configure_tracing(service="kubelet-plugin")
threads = len(os.listdir("/proc/self/task"))  # native ones too, as grpcio's C core starts
print(
    json.dumps({"modules": sorted(sys.modules), "tracing": tracing_enabled(), "threads": threads}),
    flush=True,
)
os._exit(0)  # no exit-time flush of the exporter towards an endpoint nobody listens on
"""


def _start_modules(env: dict[str, str]) -> dict[str, object]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "NEURON_DRA_"))}
    out = subprocess.run(
        [sys.executable, "-c", _START],
        env={**clean, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_without_an_otlp_endpoint_neither_the_sdk_nor_the_bus_client_is_loaded() -> None:
    started = _start_modules({})
    modules = started["modules"]
    assert isinstance(modules, list)
    assert started["tracing"] is False
    assert not [m for m in modules if m.startswith("opentelemetry.sdk")]
    # The bus client comes once the kubelet's sockets listen, not on the way there.
    assert not [m for m in modules if m == "nats" or m.startswith("nats.")]
    assert "grpc.aio" in modules  # the kubelet's protocol, needed from the start
    # Imported, but nothing made: grpcio's C core starts no thread before the service runs,
    # so a launcher may import the plugin and fork node agents afterwards.
    assert started["threads"] == 1


def test_with_an_otlp_endpoint_the_sdk_is_loaded_and_spans_are_recorded() -> None:
    started = _start_modules({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"})
    modules = started["modules"]
    assert isinstance(modules, list)
    assert started["tracing"] is True
    assert "opentelemetry.sdk.trace" in modules
