"""What /metrics serves: the product's metrics, with the names the alert rules and the
dashboard read, in a text promtool accepts; and only the series the product decided on."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from neuron_dra_cli.toolbuild import ensure_promtool
from neuron_dra_common.telemetry import CONTENT_TYPE, REGISTRY, expose
from prometheus_client.parser import text_string_to_metric_families

from tests.unit.telemetry.test_metric_names import product_metrics

MONITORING = (
    Path(__file__).resolve().parents[3] / "deploy" / "kustomize" / "components" / "monitoring"
)


@pytest.fixture(scope="module")
def scraped() -> str:
    """One scrape, with every product metric defined and some of them counted."""
    product_metrics()  # imports every module that defines metrics
    from neuron_dra_common.bus.metrics import HANDLE_SECONDS, MESSAGES
    from neuron_dra_common.kube.metrics import LEADING

    MESSAGES.labels("slice-publisher", "acked").inc()
    HANDLE_SECONDS.labels("slice-publisher").observe(0.003)
    LEADING.labels("neuron-dra-slice-publisher").set(1)
    return expose().decode()


def _sample_names(text: str) -> set[str]:
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def test_counters_histograms_and_process_series_are_named_as_before(scraped: str) -> None:
    names = _sample_names(scraped)
    assert {
        "neuron_dra_bus_messages_total",
        "neuron_dra_bus_handle_seconds_bucket",
        "neuron_dra_bus_handle_seconds_sum",
        "neuron_dra_bus_handle_seconds_count",
        "neuron_dra_leader",
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "process_start_time_seconds",
        "process_open_fds",
        "python_info",
    } <= names
    # No series the rules and dashboard never read, in every process of the fleet.
    assert not [n for n in names if n.endswith("_created")]
    assert not [n for n in names if n.startswith("python_gc_")]


def test_every_metric_the_rules_and_dashboard_read_is_defined(scraped: str) -> None:
    defined: set[str] = set()
    for name, kind in product_metrics():
        defined |= {name, f"{name}_total"} if kind == "counter" else {name}
        if kind == "histogram":
            defined |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    read: set[str] = set()
    for path in (MONITORING / "prometheusrule.yaml", MONITORING / "dashboard.json"):
        read |= set(re.findall(r"\bneuron_dra_[a-z0-9_]*[a-z0-9]", path.read_text()))
    # Recording rules' own outputs (neuron_dra:...) have a colon and are not matched.
    assert read, "no metric names found in the rules and dashboard"
    assert read <= defined, sorted(read - defined)


def test_promtool_accepts_what_metrics_serves(scraped: str, tmp_path: Path) -> None:
    promtool = ensure_promtool(progress=lambda _: None)
    assert CONTENT_TYPE.startswith("text/plain; version=0.0.4")
    out = subprocess.run(
        [str(promtool), "check", "metrics"],
        input=scraped.encode(),
        capture_output=True,
        timeout=60,
        check=False,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    # promtool's lint complains only about style (a counter's HELP, units); a format error
    # makes it exit 1 with "error while linting" or a parse error on stderr.
    problems = (out.stdout + out.stderr).decode()
    assert "parse" not in problems.lower(), problems
    assert "error while linting" not in problems, problems


def test_one_metric_name_cannot_be_defined_twice() -> None:
    from neuron_dra_common.telemetry import Counter

    with pytest.raises(ValueError, match="neuron_dra_bus_messages"):
        Counter("neuron_dra_bus_messages", "Again", ["consumer", "outcome"])
    assert (
        REGISTRY.get_sample_value(
            "neuron_dra_bus_messages_total", {"consumer": "x", "outcome": "y"}
        )
        is None
    )
