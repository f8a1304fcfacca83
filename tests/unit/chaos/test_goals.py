"""The chaos driver judges R1 and R2 on its own run, and says when a run cannot tell."""

from __future__ import annotations

import json

from chaos.driver import Outcome


def test_a_clean_30_minute_run_with_fast_returns_meets_both() -> None:
    outcome = Outcome(
        seed=1,
        seconds=1800,
        server_returns=[("nats", 2.5), ("kube-apiserver", 9.9)],
        converged_seconds=3.0,
    )
    assert outcome.goals() == {
        "R1": "met",
        "R2": "met (slowest 9.9 s)",
        "R3": "not measured: no --fuzz",
        "R4": "not measured: no --rollout",
    }
    assert json.loads(outcome.json_line())["goals"] == outcome.goals()
    [line] = [row for row in outcome.table().splitlines() if row.startswith("goal R2")]
    label, verdict = (part.strip() for part in line.split("  ", 1))
    assert label == "goal R2: NATS or apiserver back -> all up within 10 s"
    assert verdict == "met (slowest 9.9 s)"


def test_a_short_run_says_how_much_of_r1_it_covered() -> None:
    outcome = Outcome(seed=1, seconds=120, converged_seconds=1.0)
    assert outcome.goals() == {
        "R1": "met for 2 of the goal's 30 minutes",
        "R2": "not measured: no server was restarted",
        "R3": "not measured: no --fuzz",
        "R4": "not measured: no --rollout",
    }


def test_anything_held_twice_or_a_slow_return_is_not_met() -> None:
    outcome = Outcome(
        seed=1,
        seconds=1800,
        violations=["neurondevice3 of trn2-0 held by claims a and b"],
        server_returns=[("kube-apiserver", 12.0)],
        converged_seconds=3.0,
    )
    assert outcome.goals()["R1"] == "NOT MET"
    assert outcome.goals()["R2"] == "NOT MET (slowest 12.0 s)"
    lost = Outcome(seed=1, seconds=1800, audit_mismatches=["claim c prepared twice"])
    assert lost.goals()["R1"] == "NOT MET"


def test_a_slow_return_fails_the_run_and_says_what_was_still_down() -> None:
    slow = "nats back -> all up took 14.2 s, over 10 s; still down at 10 s: audit"
    outcome = Outcome(
        seed=1,
        seconds=60,
        server_returns=[("nats", 14.2)],
        slow_returns=[slow],
        converged_seconds=3.0,
    )
    assert not outcome.ok
    assert outcome.goals()["R2"] == "NOT MET (slowest 14.2 s)"
    assert f"R2 NOT MET {slow}" in outcome.table().splitlines()
    assert json.loads(outcome.json_line())["slowReturns"] == [slow]
    fast = Outcome(seed=1, seconds=60, server_returns=[("nats", 6.3)], converged_seconds=3.0)
    assert fast.ok


def test_a_run_that_did_not_converge_does_not_meet_r1() -> None:
    outcome = Outcome(seed=1, seconds=1800, not_converged=["node n1 offers no ResourceSlice pool"])
    assert not outcome.ok
    assert outcome.goals()["R1"] == "NOT MET"
