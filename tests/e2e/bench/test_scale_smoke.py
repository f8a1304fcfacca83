"""``python -m bench scale --quick`` from the command line, as a user runs it: 100 simulated
trn2u nodes on a real control plane and a three-server NATS cluster, the product's cluster
services as processes. It prints every figure, judges every goal, and one JSON line."""

from __future__ import annotations

import json

import pytest

from bench.scenarios.scale import SERVICES
from tests.e2e.bench.support import run_bench

pytestmark = [pytest.mark.stack]


def test_scale_quick_runs_end_to_end_and_prints_every_figure() -> None:
    proc = run_bench("scale", "--quick", timeout=540)
    out = proc.stdout
    assert "== scale (100 trn2u nodes, 25 UltraServers)" in out
    for goal in ("lost node p99 <= 5 s", "slices cold <= 1.2 x bare", "no service over 1 GiB"):
        assert f"  {goal}: " in out
    line = json.loads(out.strip().splitlines()[-1])
    assert line["nodes"] == 100
    figures = line["figures"]
    # The publisher wrote exactly what the bare loop wrote: every node's pool, once.
    assert figures["slice writes"]["value"] == figures["slice writes"]["baseline"] >= 100
    # A silent node is declared lost by the detector, and a fault taints its device.
    assert 1.0 < figures["silent node -> lost p99 (5)"]["value"] < 30.0
    assert 0.0 < figures["device fault -> taint p99 (5)"]["value"] < 30_000.0
    assert 0.0 < figures["25 workloads -> Allocated p99"]["value"] < 120.0
    assert all(line["rss_mib"][s] > 10 for s in SERVICES)
    # The fleet kept its pace: a heartbeat per node per second.
    assert line["heartbeats_per_s"] > 80
    assert set(line["store_mib"]) == {"nats-0", "nats-1", "nats-2"}


def test_scale_failover_and_chaos_at_sixteen_nodes_print_what_a_user_must_see() -> None:
    """``--failover``: the server leading every stream killed with SIGKILL mid-run; every
    consumer handles messages again, the audit holds every acknowledged claim event once, and
    the figures taken through the failover stand next to the steady ones. ``--chaos``: the
    chaos checks hold on the whole fleet after the churn. Progress goes to stderr."""
    proc = run_bench("scale", "--quick", "--nodes", "16", "--failover", "--chaos", timeout=400)
    progress = proc.stderr
    for phase in (
        "nodes registered: done 16/16",
        "slices written by the publisher: done",
        "failover: the audit catching up: done",
        "chaos step 6/6",
    ):
        assert phase in progress, progress[-3000:]
    out = proc.stdout
    assert "failover: device fault -> taint p99" in out
    assert "(steady)" in out
    line = json.loads(out.strip().splitlines()[-1])
    failover = line["failover"]
    # The killed server led every stream and the services' consumers; each has a new leader.
    assert {"NEURON_HEARTBEAT", "NEURON_AUDIT", "audit", "health-monitor-heartbeats"} <= set(
        failover["led"]
    )
    assert set(failover["new_leader_s"]) == set(failover["led"])
    # Every consumer handled messages again: within NATS's election timeout (4-9 s, then a
    # delivery), the audit's within its sources' retry (see README "Sizing").
    resume = failover["resume_s"]
    assert set(resume) == {
        "audit",
        "health-monitor-heartbeats",
        "slice-publisher-health",
        "slice-publisher-inventory",
    }
    assert all(v is not None and v < 60.0 for v in resume.values()), resume
    assert resume["health-monitor-heartbeats"] < 11.0
    # Nothing lost, nothing twice: the audit reconciles.
    assert failover["events_reconciled"] > 20
    assert failover["missing"] == 0
    assert failover["audited_twice"] == 0
    assert failover["probe_publishes_failed"] == 0
    assert failover["audit_caught_up_s"] is not None
    figures = line["figures"]
    assert figures["failover: silent node -> lost p99"]["value"] > 1.0
    assert line["chaos"]["met"] is True, line["chaos"]
    assert line["chaos"]["steps"] == 6
