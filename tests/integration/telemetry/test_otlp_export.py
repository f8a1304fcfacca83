"""A service's spans reach a real trace backend (Jaeger, built from its Go module) with
nothing but the standard OpenTelemetry variables set."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from neuron_dra_cli.stack import tracing
from neuron_dra_cli.toolbuild import ensure_jaeger

# What a service's start does (runtime.process.run): settings from the environment, then
# tracing with the settings' NEURON_DRA_OTLP_ENDPOINT.
SERVICE = """
from neuron_dra_common.settings import ServiceSettings, load
from neuron_dra_common.telemetry import configure_tracing, get_tracer, shutdown_tracing
endpoint = load(ServiceSettings, argv=[]).otlp_endpoint
if configure_tracing(service="slice-publisher", otlp_endpoint=endpoint) is None:
    print("off")
    raise SystemExit(0)
with get_tracer("probe").start_as_current_span("probe span") as span:
    print(format(span.get_span_context().trace_id, "032x"))
shutdown_tracing()
"""


@pytest.fixture(scope="module")
def jaeger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, int]]:
    state = tmp_path_factory.mktemp("jaeger")
    component = tracing.jaeger(binary=ensure_jaeger(progress=lambda _: None), state_dir=state)
    log = state / "jaeger.log"
    with log.open("wb") as out, subprocess.Popen(component.argv, stdout=out, stderr=out) as proc:
        try:
            deadline = time.monotonic() + 60
            while not component.ready():
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "Jaeger not ready in 60 s"
                time.sleep(0.2)
            yield component.ports
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def run_service(env: dict[str, str]) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "NEURON_DRA_"))}
    out = subprocess.run(
        [sys.executable, "-c", SERVICE],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.strip()


def fetch(ports: dict[str, int], trace_id: str) -> dict[str, Any] | None:
    url = f"http://127.0.0.1:{ports['ui']}/api/v3/traces/{trace_id}"
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            body: dict[str, Any] = json.load(resp)
            return body
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


def resource_of(ports: dict[str, int], trace_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while (body := fetch(ports, trace_id)) is None:
        assert time.monotonic() < deadline, f"trace {trace_id} never reached Jaeger"
        time.sleep(0.3)
    [rs] = body["result"]["resourceSpans"]
    return {a["key"]: a["value"].get("stringValue") for a in rs["resource"]["attributes"]}


def test_the_standard_endpoint_alone_exports_with_the_products_resource(
    jaeger: dict[str, int],
) -> None:
    trace_id = run_service(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{jaeger['otlp_grpc']}",
            "K8S_POD_NAME": "neuron-dra-slice-publisher-abc",
            "K8S_NODE_NAME": "ip-10-0-0-1",
        }
    )
    resource = resource_of(jaeger, trace_id)
    assert resource["service.name"] == "slice-publisher"
    assert resource["service.namespace"] == "neuron-dra"
    assert resource["service.version"]
    assert resource["k8s.pod.name"] == "neuron-dra-slice-publisher-abc"
    assert resource["k8s.node.name"] == "ip-10-0-0-1"


def test_the_products_own_variable_still_works_and_otel_names_win(
    jaeger: dict[str, int],
) -> None:
    trace_id = run_service(
        {
            "NEURON_DRA_OTLP_ENDPOINT": f"http://127.0.0.1:{jaeger['otlp_grpc']}",
            "OTEL_SERVICE_NAME": "publisher-eu",
        }
    )
    assert resource_of(jaeger, trace_id)["service.name"] == "publisher-eu"


def test_no_endpoint_no_export() -> None:
    assert run_service({}) == "off"
    assert (
        run_service({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4317", "OTEL_SDK_DISABLED": "true"})
        == "off"
    )
