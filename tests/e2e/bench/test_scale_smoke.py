"""``python -m bench scale --quick`` from the command line, as a user runs it: 100 simulated
trn2u nodes on a real control plane and a three-server NATS cluster, the product's cluster
services as processes. It prints every figure, judges every goal, and one JSON line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.scenarios.scale import SERVICES
from tests.fixtures.stack import REPO

pytestmark = [pytest.mark.stack]


def test_scale_quick_runs_end_to_end_and_prints_every_figure() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "scale", "--quick"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=540,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
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
