"""What /metrics serves is Prometheus's text format: promtool accepts it, Prometheus's own
Python parser reads back exactly the values set, and mistakes in defining or using a metric
are refused with a message naming the metric."""

from __future__ import annotations

import math
import os
import subprocess
import time
from pathlib import Path

import pytest
from neuron_dra_cli.toolbuild import ensure_promtool
from neuron_dra_common.telemetry.registry import CONTENT_TYPE, Counter, Gauge, Histogram, Registry
from prometheus_client.parser import text_string_to_metric_families


def _families(
    registry: Registry,
) -> dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    """Every sample the official parser finds, by family then (sample name, labels)."""
    out: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for family in text_string_to_metric_families(registry.expose().decode()):
        samples = out.setdefault(f"{family.name}:{family.type}", {})
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _filled() -> Registry:
    registry = Registry(process=True)
    ops = Counter(
        "demo_operations", "Operations\nby outcome \\ kind", ["op", "outcome"], registry=registry
    )
    ops.labels("prepare", "ok").inc()
    ops.labels(op="prepare", outcome="ok").inc(2)
    ops.labels("odd", 'quote " back \\ line \n end').inc()
    Counter("demo_retries_total", "Retries", registry=registry).inc(0.5)
    gauge = Gauge("demo_claims", "Claims", registry=registry)
    gauge.inc(3)
    gauge.dec()
    Gauge("demo_big", "A large value", registry=registry).set(1e20)
    Gauge("demo_read", "Read at scrape", registry=registry).set_function(lambda: 7)
    hist = Histogram("demo_seconds", "Durations", ["op"], buckets=(0.1, 1, 10), registry=registry)
    for value in (0.05, 0.1, 0.5, 3, 100):
        hist.labels("prepare").observe(value)
    return registry


def test_the_official_parser_reads_back_every_value() -> None:
    families = _families(_filled())
    ops = families["demo_operations:counter"]
    assert ops[("demo_operations_total", (("op", "prepare"), ("outcome", "ok")))] == 3
    odd = (("op", "odd"), ("outcome", 'quote " back \\ line \n end'))
    assert ops[("demo_operations_total", odd)] == 1
    assert families["demo_retries:counter"] == {("demo_retries_total", ()): 0.5}
    assert families["demo_claims:gauge"] == {("demo_claims", ()): 2}
    assert families["demo_big:gauge"] == {("demo_big", ()): 1e20}
    assert families["demo_read:gauge"] == {("demo_read", ()): 7}
    hist = families["demo_seconds:histogram"]
    buckets = {dict(k[1])["le"]: v for k, v in hist.items() if k[0] == "demo_seconds_bucket"}
    assert buckets == {"0.1": 2, "1.0": 3, "10.0": 4, "+Inf": 5}
    assert hist[("demo_seconds_count", (("op", "prepare"),))] == 5
    assert hist[("demo_seconds_sum", (("op", "prepare"),))] == pytest.approx(103.65)


def test_the_process_series_describe_this_process() -> None:
    families = _families(Registry(process=True))
    rss = families["process_resident_memory_bytes:gauge"][("process_resident_memory_bytes", ())]
    assert 1 << 20 < rss < 8 << 30
    started = families["process_start_time_seconds:gauge"][("process_start_time_seconds", ())]
    assert time.time() - 24 * 3600 < started <= time.time() + 1
    fds = families["process_open_fds:gauge"][("process_open_fds", ())]
    assert fds >= 3
    assert families["process_cpu_seconds:counter"][("process_cpu_seconds_total", ())] > 0
    (info,) = families["python_info:gauge"]
    assert dict(info[1])["major"] == "3"
    assert "python_info:gauge" not in _families(Registry())


def test_promtool_accepts_what_metrics_serves(tmp_path: Path) -> None:
    promtool = ensure_promtool(progress=lambda _: None)
    exposed = _filled().expose()
    assert CONTENT_TYPE.startswith("text/plain; version=0.0.4")
    out = subprocess.run(
        [str(promtool), "check", "metrics"],
        input=exposed,
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


def test_labels_are_given_in_order_or_by_name_and_must_all_be_there() -> None:
    registry = Registry()
    ops = Counter("demo_ops", "Ops", ["op", "outcome"], registry=registry)
    assert ops.labels("a", "b") is ops.labels(op="a", outcome="b")
    with pytest.raises(ValueError, match=r"demo_ops takes 2 label values \(op, outcome\), not 1"):
        ops.labels("a")
    with pytest.raises(ValueError, match="demo_ops takes the labels op, outcome, not op"):
        ops.labels(op="a")
    with pytest.raises(ValueError, match=r"demo_ops has labels \(op, outcome\): call .labels"):
        ops.inc()
    with pytest.raises(ValueError, match="demo_plain has no labels"):
        Gauge("demo_plain", "Plain", registry=registry).labels("x")


def test_mistakes_in_a_definition_name_the_metric() -> None:
    registry = Registry()
    Counter("demo_once", "Once", registry=registry)
    with pytest.raises(ValueError, match="demo_once is defined twice"):
        Counter("demo_once", "Again", registry=registry)
    with pytest.raises(ValueError, match="'demo-dash' is not a valid metric name"):
        Gauge("demo-dash", "Dash", registry=registry)
    with pytest.raises(ValueError, match="demo_le: 'le' is not a valid label name"):
        Histogram("demo_le", "Le", ["le"], registry=registry)
    with pytest.raises(ValueError, match="demo_down cannot go down"):
        Counter("demo_down", "Down", registry=registry).inc(-1)
    with pytest.raises(ValueError, match="demo_buckets_seconds: buckets must rise"):
        Histogram("demo_buckets_seconds", "Buckets", buckets=(1, 0.5), registry=registry)
    # One series under two names: a counter's _total, a histogram's _count.
    Counter("demo_sent", "Sent", registry=registry)
    with pytest.raises(ValueError, match="demo_sent_total would expose the series of demo_sent"):
        Gauge("demo_sent_total", "Sent too", registry=registry)
    Histogram("demo_wait", "Wait", registry=registry)
    with pytest.raises(ValueError, match="demo_wait_count would expose the series of demo_wait"):
        Gauge("demo_wait_count", "Waits", registry=registry)


def test_large_bounds_are_written_as_prometheus_clients_write_them() -> None:
    registry = Registry()
    hist = Histogram("demo_bytes", "Sizes", buckets=(1e3, 1e6, 2.5e7), registry=registry)
    hist.observe(2e6)
    hist.observe(math.nan)
    families = _families(registry)["demo_bytes:histogram"]
    buckets = {dict(k[1])["le"]: v for k, v in families.items() if k[0] == "demo_bytes_bucket"}
    assert buckets == {"1000.0": 0, "1e+06": 0, "2.5e+07": 1, "+Inf": 2}


def test_samples_are_read_back_by_name_and_labels() -> None:
    registry = Registry()
    Gauge("demo_leader", "Leader", ["lease"], registry=registry).labels("ops").set(1)
    hist = Histogram("demo_wait_seconds", "Wait", buckets=(1,), registry=registry)
    hist.observe(math.inf)
    assert registry.get_sample_value("demo_leader", {"lease": "ops"}) == 1
    assert registry.get_sample_value("demo_leader", {"lease": "other"}) is None
    assert registry.get_sample_value("demo_wait_seconds_bucket", {"le": "1.0"}) == 0
    assert registry.get_sample_value("demo_wait_seconds_bucket", {"le": "+Inf"}) == 1
