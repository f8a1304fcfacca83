"""``bench scale --failover``'s pure pieces: each consumer's resume time read from its
handled-message counts, the audit reconciled against what was published, and the lines the
report prints next to the steady figures."""

from __future__ import annotations

import json
import math

from bench.failover import FailoverFigures, audit_reconciles, handled, resumed
from bench.scenarios.scale import Measured, ScaleReport, Sizes, failover_figures

METRICS = """\
# HELP neuron_dra_bus_messages_total Messages a consumer handled.
# TYPE neuron_dra_bus_messages_total counter
neuron_dra_bus_messages_total{consumer="audit",outcome="ack",stream="NEURON_AUDIT"} 40
neuron_dra_bus_messages_total{consumer="audit",outcome="dead-letter",stream="NEURON_AUDIT"} 2
neuron_dra_bus_messages_total{consumer="alert",outcome="ack",stream="NEURON_AUDIT"} 7
"""


def test_handled_counts_every_outcome_of_one_consumer_only() -> None:
    assert handled(METRICS, "audit") == 42
    assert handled(METRICS, "alert") == 7
    assert handled(METRICS, "slice-publisher-health") == 0


def test_resume_is_the_first_message_handled_after_the_kill() -> None:
    samples = {
        # still handling what it had in hand at the kill (10.0), then nothing until 14.1
        "health-monitor-heartbeats": [(9.8, 100), (10.2, 120), (10.4, 120), (14.1, 121)],
        # never handled anything after the kill
        "audit": [(9.9, 5), (10.3, 6), (20.0, 6)],
        # no reading after the kill at all
        "slice-publisher-health": [(9.0, 1)],
    }
    got = resumed(samples, killed_at=10.0)
    assert got == {
        "health-monitor-heartbeats": 4.1,
        "audit": None,
        "slice-publisher-health": None,
    }


def test_the_audit_reconciles_only_when_each_published_event_is_there_once() -> None:
    assert audit_reconciles(["a", "b"], ["b", "x", "a"]) == ([], [])
    assert audit_reconciles(["a", "b", "c"], ["a", "a", "c"]) == (["b"], ["a"])


def test_failover_verdicts() -> None:
    ok = FailoverFigures(killed="nats-1", resume_s={"audit": 4.9, "health-monitor-heartbeats": 3})
    assert ok.resumed_within_goal()
    assert ok.nothing_lost()
    slow = FailoverFigures(resume_s={"audit": 5.2})
    assert not slow.resumed_within_goal()
    never = FailoverFigures(resume_s={"audit": None})
    assert not never.resumed_within_goal()
    assert not FailoverFigures(missing=["claim/1"]).nothing_lost()
    assert not FailoverFigures(twice=["claim/1"]).nothing_lost()
    assert not FailoverFigures(probes_failed=1).nothing_lost()


def _measured() -> Measured:
    sizes = Sizes.of(100, quick=True)
    m = Measured(sizes=sizes, taint_s=[0.2, 0.3], lost_s=[3.1, 3.3], allocated_s=[5.0, 9.0])
    m.during_failover = Measured(
        sizes=sizes, taint_s=[6.5, 7.0], lost_s=[3.2, 9.5], allocated_s=[12.0, 15.0]
    )
    m.failover = FailoverFigures(
        killed="nats-2",
        led=["NEURON_AUDIT", "NEURON_HEARTBEAT", "audit"],
        resume_s={"audit": 7.5, "health-monitor-heartbeats": 4.2},
        elected_s={"NEURON_HEARTBEAT": 4.0, "NEURON_AUDIT": 6.9},
        published=120,
        audit_caught_up_s=31.0,
    )
    return m


def test_failover_figures_stand_next_to_their_steady_twins() -> None:
    figures = {f.name: f for f in failover_figures(_measured())}
    taint = figures["failover: device fault -> taint p99"]
    assert (taint.value, taint.baseline, taint.unit) == (7000.0, 300.0, "ms")
    lost = figures["failover: silent node -> lost p99"]
    assert (lost.value, lost.baseline) == (9.5, 3.3)
    assert figures["failover: 25 workloads -> Allocated p50"].value == 15.0
    assert failover_figures(Measured(sizes=Sizes.of(100, quick=True))) == []
    assert math.isnan(
        failover_figures(
            Measured(
                sizes=Sizes.of(100, quick=True),
                during_failover=Measured(sizes=Sizes.of(100, quick=True)),
            )
        )[0].value
    )


def test_the_report_judges_the_failover_and_its_json_line_carries_it() -> None:
    report = ScaleReport(runs=[_measured()])
    table = report.table()
    assert (
        "failover: killed nats-2 (SIGKILL), which led NEURON_AUDIT, NEURON_HEARTBEAT, audit"
        in table
    )
    assert (
        "every consumer resumed <= 5 s: NOT MET (audit 7.5 s, health-monitor-heartbeats 4.2 s)"
        in table
    )
    assert "no event lost (the audit reconciles): met: 120 events acknowledged, 0 missing" in table
    line = json.loads(report.json_line())
    assert line["failover"]["resume_s"] == {"audit": 7.5, "health-monitor-heartbeats": 4.2}
    assert line["failover"]["audit_caught_up_s"] == 31.0
    assert "chaos" not in line
