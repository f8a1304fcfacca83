"""A bounded chaos run, as a user runs it: ``python -m chaos`` against a stack of its fleet,
with pods and UltraServer workloads churned while neuron-dra processes, NATS and the
apiserver are killed and devices fail; nothing may be held twice, and everything converges
afterwards, every failed device repaired and untainted. Then malformed messages go to the
stack's consumers: each is one dead letter of each consumer that reads it, and nothing dies.
Last, a node's kubelet plugin is rolled once per prepare and unprepare step, the new plugin
dying at that step: the old one finishes each time."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest
from neuron_dra_kubelet_plugin.faults import STEPS

from tests.fixtures.stack import REPO, KubeStack, start_stack, stop_stack

pytestmark = pytest.mark.stack

FLEET = REPO / "tests" / "fleets" / "chaos.yaml"
SEED = 20261126
FUZZ = 300


@pytest.fixture(scope="module")
def chaos_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeStack]:
    state_dir = tmp_path_factory.mktemp("chaos-stack")
    stack = start_stack(state_dir, fleet=FLEET)
    try:
        yield stack
    finally:
        stop_stack(state_dir)


def test_two_minutes_of_churn_and_kills_hold_nothing_twice_and_converge(
    chaos_stack: KubeStack,
) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "chaos",
            "--minutes",
            "2",
            "--seed",
            str(SEED),
            "--fuzz",
            str(FUZZ),
            "--rollout",
            "--state-dir",
            str(chaos_stack.state_dir),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    print(proc.stdout)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["ok"] is True
    assert result["seed"] == SEED
    assert result["violations"] == []
    assert result["failures"] == []
    assert result["auditMismatches"] == []
    assert result["checks"] > 10
    assert result["convergedSeconds"] is not None
    assert result["goals"]["R1"] == "met for 2 of the goal's 30 minutes"
    fuzz = result["fuzz"]
    assert fuzz["sent"] == FUZZ
    # The stack's durable consumers of inventories, heartbeats, health and alerts all got some.
    assert {"slice-publisher-inventory", "health-monitor-heartbeats", "alert"} <= set(
        fuzz["consumers"]
    )
    assert fuzz["expected"] >= FUZZ
    assert fuzz["deadLettered"] == fuzz["expected"], fuzz["missing"]
    assert fuzz["duplicates"] == 0
    assert fuzz["crashes"] == []
    assert result["goals"]["R3"] == f"met for {FUZZ} of the goal's 10,000 inputs"
    assert [r["step"] for r in result["rollout"]] == list(STEPS)
    assert [r["problem"] for r in result["rollout"]] == [""] * len(STEPS)
    assert result["rolloutProblems"] == []
    assert result["goals"]["R4"].startswith("met (slowest ")
    steps = result["steps"]
    assert any("SIGKILL" in s or "SIGTERM" in s for s in steps), steps
    assert any(s.startswith("pod of") for s in steps), steps
    assert any(s.startswith("workload of") for s in steps), steps
    assert any(s.startswith("device failed") for s in steps), steps
