"""``neuron-dra events``: start times, filters and the one-line descriptions."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from neuron_dra_cli.errors import CliError
from neuron_dra_cli.events_cmd import Filter, describe, matches, parse_since
from neuron_dra_cli.main import build_parser
from neuron_dra_common.events import (
    AllocationDecided,
    ClaimPrepared,
    DeviceHealthChanged,
    DeviceTaint,
    DeviceTaintChanged,
    ObjectRef,
    WorkloadStateChanged,
)

NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)
TRAIN = ObjectRef(namespace="ml", name="train")


def test_since_takes_durations_and_times_and_names_a_bad_one() -> None:
    assert parse_since("90s", now=NOW) == datetime(2026, 3, 1, 11, 58, 30, tzinfo=UTC)
    assert parse_since("2d", now=NOW) == datetime(2026, 2, 27, 12, tzinfo=UTC)
    assert parse_since("2026-03-01T10:00:00Z") == datetime(2026, 3, 1, 10, tzinfo=UTC)
    with pytest.raises(CliError, match="--since 'yesterday'"):
        parse_since("yesterday")


def test_filters_by_node_workload_and_claim() -> None:
    health = DeviceHealthChanged(node="n1", device="d", health="Unhealthy")
    decided = AllocationDecided(request_id="r", workload=TRAIN, granted=True, nodes=("n1", "n2"))
    state = WorkloadStateChanged(workload=TRAIN, state="Allocated")
    claim = ClaimPrepared(node="n2", claim=ObjectRef(namespace="ml", name="c0"), devices=("d",))
    on_n2 = Filter(node="n2")
    assert [matches(e, on_n2) for e in (health, decided, state, claim)] == [
        False,
        True,
        False,
        True,
    ]
    train = Filter(workload=("ml", "train"))
    assert [matches(e, train) for e in (health, decided, state, claim)] == [
        False,
        True,
        True,
        False,
    ]
    c0 = Filter(claim=("ml", "c0"))
    assert [matches(e, c0) for e in (health, decided, state, claim)] == [
        False,
        False,
        False,
        True,
    ]


def test_descriptions_say_what_happened() -> None:
    event = DeviceHealthChanged(
        node="n1",
        device="d",
        health="Unhealthy",
        previous="Healthy",
        error_type="DMA_ERROR",
        severity="uncorrectable",
    )
    assert describe(event) == "Unhealthy (was Healthy) DMA_ERROR uncorrectable"
    assert (
        describe(
            WorkloadStateChanged(
                workload=TRAIN, state="Failed", previous="Allocating", reason="NoCapacity"
            )
        )
        == "Failed (was Allocating) NoCapacity"
    )
    claim = ObjectRef(namespace="neuron-monitor", name="m")
    held = ClaimPrepared(node="n1", claim=claim, devices=("d0", "d1"))
    assert describe(held) == "prepared on n1: d0, d1"
    watched = ClaimPrepared(node="n1", claim=claim, devices=("d0", "d1"), admin_access=("d0", "d1"))
    assert describe(watched) == "prepared on n1: d0, d1 (admin access to 2, holding none of them)"


def test_a_taint_change_shows_on_its_node_with_the_taints_and_why() -> None:
    taint = DeviceTaint(key="neuron.aws.com/hardware-error", value="DMA_ERROR", effect="NoExecute")
    tainted = DeviceTaintChanged(
        node="n1", device="neurondevice3", taints=(taint,), reason="DMA_ERROR uncorrectable"
    )
    assert matches(tainted, Filter(node="n1"))
    assert not matches(tainted, Filter(node="n2"))
    assert describe(tainted) == (
        "tainted neuron.aws.com/hardware-error=DMA_ERROR:NoExecute - DMA_ERROR uncorrectable"
    )
    cleared = DeviceTaintChanged(node="n1", device="neurondevice3", previous=(taint,))
    assert describe(cleared) == "untainted"
    withheld = DeviceTaintChanged(node="n1", device="neurondevice3", taints=(taint,), withheld=True)
    assert "left out of the pool" in describe(withheld)


def test_the_command_line() -> None:
    args = build_parser().parse_args(
        [
            "events",
            "--follow",
            "--node",
            "n1",
            "--workload",
            "ml/train",
            "--since",
            "1h",
            "-o",
            "json",
        ]
    )
    assert (args.follow, args.node, args.workload, args.since, args.output) == (
        True,
        "n1",
        "ml/train",
        "1h",
        "json",
    )
