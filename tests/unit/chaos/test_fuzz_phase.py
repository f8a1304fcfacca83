"""The chaos driver's fuzz phase (R3): which consumers a message is due to, and its verdict."""

from __future__ import annotations

import pytest

from chaos.driver import Outcome
from chaos.fuzz import FuzzResult, _messages, crashed, subject_matches


@pytest.mark.parametrize(
    ("pattern", "subject", "matches"),
    [
        ("neuron.health.>", "neuron.health.node-1.neurondevice3", True),
        ("neuron.health.>", "neuron.health", False),
        ("neuron.health.*", "neuron.health.node-1", True),
        ("neuron.health.*", "neuron.health.node-1.neurondevice3", False),
        ("neuron.health.node-1.>", "neuron.health.node-2.neurondevice3", False),
        ("neuron.heartbeat.*", "neuron.heartbeat.node-1", True),
        ("a.b", "a.b", True),
        ("a.b", "a.b.c", False),
    ],
)
def test_subjects_match_as_nats_matches_them(pattern: str, subject: str, matches: bool) -> None:
    assert subject_matches(pattern, subject) is matches


def test_the_mix_is_all_malformed_on_subjects_the_consumers_read() -> None:
    durables = {"slice-publisher-inventory": ("neuron.inventory.>",), "x": ("neuron.heartbeat.*",)}
    messages = _messages(500, 7, durables)
    assert len(messages) == 500
    assert all(m.malformed for m in messages)
    assert not [m for m in messages if m.what == "oversized"]
    for m in messages:
        assert any(subject_matches(f, m.subject) for fs in durables.values() for f in fs), m
    kinds = {m.what for m in messages}
    assert {"garbage", "truncated", "missing field", "too many devices"} <= kinds
    # Reproducible from the seed (but for the send times some cases carry).
    again = _messages(500, 7, durables)
    assert [(m.what, m.subject) for m in again] == [(m.what, m.subject) for m in messages]


def test_no_consumer_no_message() -> None:
    assert _messages(100, 1, {"elsewhere": ("other.>",)}) == []


def test_a_process_down_or_under_a_new_pid_died() -> None:
    before = {"audit": 10, "alerts": 11, "nats": 12}
    after = [("audit", 10), ("alerts", 99), ("nats", 12)]
    assert crashed(before, after, ["nats"]) == ["nats down", "alerts restarted"]
    assert crashed(before, list(before.items()), []) == []


def _result(**changes: object) -> FuzzResult:
    base = FuzzResult(
        sent=10_000,
        expected=10_400,
        dead_lettered=10_400,
        duplicates=0,
        missing=(),
        consumers=("audit", "slice-publisher-inventory"),
    )
    return base._replace(**changes)  # type: ignore[arg-type]


def test_r3_verdicts() -> None:
    done = Outcome(seed=1, seconds=1800, converged_seconds=1.0, fuzz=_result())
    assert done.goals()["R3"] == "met"
    assert done.ok
    short = Outcome(seed=1, seconds=60, converged_seconds=1.0, fuzz=_result(sent=300))
    assert short.goals()["R3"] == "met for 300 of the goal's 10,000 inputs"
    lost = Outcome(seed=1, seconds=60, converged_seconds=1.0, fuzz=_result(dead_lettered=10_399))
    assert lost.goals()["R3"] == "NOT MET"
    assert not lost.ok
    doubled = Outcome(seed=1, seconds=60, converged_seconds=1.0, fuzz=_result(duplicates=1))
    assert not doubled.ok
    died = Outcome(seed=1, seconds=60, converged_seconds=1.0, fuzz=_result(), fuzz_crashes=["x"])
    assert died.goals()["R3"] == "NOT MET"
    assert Outcome(seed=1, seconds=60).goals()["R3"] == "not measured: no --fuzz"
