"""The ``recovery`` benchmark's reading of what it sees and its table, on hand-made objects:
which taint, condition or pod counts as the step it times, and what the report says."""

from __future__ import annotations

import json
from typing import Any

import pytest
from neuron_dra_cli.stack.fleet import parse_fleet

from bench.harness import percentile
from bench.scenarios.recovery import (
    HARDWARE_ERROR,
    NODE_LOST,
    UNREACHABLE,
    DeviceRun,
    LossRun,
    allocated_elsewhere,
    build_report,
    degraded,
    device_listed_clean,
    device_tainted,
    evicted,
    fleet_yaml,
    goal_line,
    node_tainted,
    not_ready,
    pods_running_away,
    replacing,
    witness_body,
)

Obj = dict[str, Any]


def a_slice(pool: str, generation: int, devices: dict[str, list[str]]) -> Obj:
    return {
        "metadata": {"name": f"{pool}-{generation}"},
        "spec": {
            "pool": {"name": pool, "generation": generation},
            "devices": [
                {"name": name, "taints": [{"key": k, "effect": "NoExecute"} for k in keys]}
                for name, keys in devices.items()
            ],
        },
    }


def a_pod(name: str, node: str, *, phase: str = "Running", deleting: bool = False) -> Obj:
    meta: Obj = {"name": name, "labels": {"app": "recover"}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": node}, "status": {"phase": phase}}


def test_percentile_is_the_nearest_rank_so_p99_of_few_runs_is_the_slowest() -> None:
    assert percentile([3.0, 1.0, 2.0], 99) == 3.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([float(i) for i in range(1, 201)], 99) == 199.0


def test_the_fleet_has_one_device_node_and_the_ultraservers_asked_for() -> None:
    fleet = parse_fleet(fleet_yaml(4))
    names = [n.name for n in fleet.nodes]
    assert names[0] == "trn2-48xl-0"
    assert len(names) == 1 + 4 * 4
    assert len({n.name for n in fleet.nodes if n.instance_type == "trn2u.48xlarge"}) == 16


def test_a_device_taint_counts_only_in_the_newest_generation_of_its_own_pool() -> None:
    slices = [
        a_slice("trn2-48xl-0", 1, {"neurondevice3": [HARDWARE_ERROR]}),
        a_slice("trn2-48xl-0", 2, {"neurondevice3": [], "neurondevice4": []}),
        a_slice("trn2-48xl-1", 5, {"neurondevice3": [HARDWARE_ERROR]}),
    ]
    assert not device_tainted(slices, "trn2-48xl-0", device="neurondevice3", key=HARDWARE_ERROR)
    assert device_listed_clean(slices, "trn2-48xl-0", device="neurondevice3", key=HARDWARE_ERROR)
    assert device_tainted(slices, "trn2-48xl-1", device="neurondevice3", key=HARDWARE_ERROR)
    assert not device_tainted(slices, "trn2-48xl-1", device="neurondevice3", key=NODE_LOST)
    # A device that is not listed is not "repaired": the pool must show it.
    assert not device_listed_clean(
        slices, "trn2-48xl-0", device="neurondevice9", key=HARDWARE_ERROR
    )
    assert not device_listed_clean([], "trn2-48xl-0", device="neurondevice3", key=HARDWARE_ERROR)


def test_a_lost_node_is_seen_by_any_of_its_devices_tainted() -> None:
    slices = [a_slice("us0-trn2u-48xl-1", 1, {"neurondevice0": [], "neuronnode": [NODE_LOST]})]
    assert device_tainted(slices, "us0-trn2u-48xl-1", device=None, key=NODE_LOST)
    assert not device_tainted(slices, "us0-trn2u-48xl-2", device=None, key=NODE_LOST)


@pytest.mark.parametrize(
    ("conditions", "expected"),
    [
        ([{"type": "Ready", "status": "True"}], False),
        ([{"type": "Ready", "status": "Unknown"}], True),
        ([{"type": "Ready", "status": "False"}], True),
        ([{"type": "MemoryPressure", "status": "False"}], True),
    ],
)
def test_not_ready_is_ready_anything_but_true(conditions: list[Obj], expected: bool) -> None:
    assert not_ready({"status": {"conditions": conditions}}) is expected


def test_the_unreachable_taint_is_found_by_its_key() -> None:
    node = {"spec": {"taints": [{"key": UNREACHABLE, "effect": "NoExecute"}]}}
    assert node_tainted(node, UNREACHABLE)
    assert not node_tainted({"spec": {}}, UNREACHABLE)


def test_the_witness_tolerates_unreachable_for_no_time_and_is_evicted_once_deleting() -> None:
    body = witness_body("witness-0", node="us0-trn2u-48xl-1")
    assert body["spec"]["nodeName"] == "us0-trn2u-48xl-1"
    [toleration] = body["spec"]["tolerations"]
    assert (toleration["key"], toleration["effect"], toleration["tolerationSeconds"]) == (
        UNREACHABLE,
        "NoExecute",
        0,
    )
    key = "bench-recovery/witness-0"
    assert not evicted({key: a_pod("witness-0", "n")}, key)
    assert evicted({key: a_pod("witness-0", "n", deleting=True)}, key)
    assert evicted({}, key)


def test_pods_count_as_moved_when_all_four_run_and_none_on_the_old_nodes() -> None:
    old = ["a0", "a1", "a2", "a3"]
    moved = [a_pod(f"p{i}", f"b{i}") for i in range(4)]
    assert pods_running_away(moved, "recover", avoid=old)
    leftover = [*moved[:3], a_pod("p3", "a1")]
    assert not pods_running_away(leftover, "recover", avoid=old)
    # A pod left behind on the dead node, being deleted, no longer counts.
    assert pods_running_away([*moved, a_pod("old", "a1", deleting=True)], "recover", avoid=old)
    pending = [*moved[:3], a_pod("p3", "b3", phase="Pending")]
    assert not pods_running_away(pending, "recover", avoid=old)


def test_the_workload_is_reallocated_once_allocated_without_the_old_ultraserver() -> None:
    def workload(state: str, servers: list[str], degraded_status: str = "False") -> Obj:
        return {
            "status": {
                "state": state,
                "allocatedUltraServers": servers,
                "conditions": [{"type": "Degraded", "status": degraded_status}],
            }
        }

    assert not allocated_elsewhere(workload("Allocated", ["us0"]), old="us0")
    assert not allocated_elsewhere(workload("Allocating", ["us1"]), old="us0")
    assert allocated_elsewhere(workload("Allocated", ["us1"]), old="us0")
    assert not allocated_elsewhere(None, old="us0")
    assert degraded(workload("PartiallyAllocated", ["us0"], "True"))
    assert not degraded(workload("Allocated", ["us1"]))
    assert replacing({"status": {"state": "Allocating", "reason": "Replacing"}})
    assert not replacing(workload("Allocated", ["us1"]))


def _loss(declared: float, reallocated: float) -> LossRun:
    return LossRun(
        node="us0-trn2u-48xl-1",
        old="us0",
        new="us1",
        declared=declared,
        devices_tainted=declared + 0.2,
        degraded=declared + 0.3,
        replacing=declared + 0.5,
        reallocated=reallocated,
        running=reallocated + 1.0,
        not_ready=50.0,
        unreachable=50.1,
        evicted=50.4,
    )


def test_the_report_sets_each_step_against_kubernetes_and_says_which_goals_are_met() -> None:
    devices = [
        DeviceRun(device=f"neurondevice{i}", bus=0.2, taint=0.5, untaint=0.6) for i in range(3)
    ]
    losses = [_loss(3.0, 4.0), _loss(3.5, 8.0)]
    report = build_report(devices, losses)
    figures = {f.name: f for f in report.figures}
    declared = figures["node killed -> declared lost p99"]
    assert (declared.value, declared.baseline) == (3500.0, 50000.0)
    assert declared.baseline_name == "Kubernetes: node killed -> NotReady"
    assert not declared.higher_is_better
    realloc = figures["declared -> re-allocated on the spare p99"]
    assert realloc.value == pytest.approx(4500.0)
    assert realloc.baseline == pytest.approx(400.0)  # NotReady -> witness evicted
    assert figures["device fault -> device taint p50"].value == 500.0
    notes = "\n".join(report.notes)
    assert "goal: device fault -> taint p99 <= 1.0 s: got 0.50 s (3 runs): met" in notes
    assert "goal: node lost -> declared p99 <= 5.0 s: got 3.50 s (2 runs): met" in notes
    assert "goal: declared -> re-allocated p99 <= 3.0 s: got 4.50 s (2 runs): NOT met" in notes
    table = report.table()
    assert "node killed -> pods Running on the spare p99" in table
    line = json.loads(report.json_line())
    assert line["figures"]["node killed -> declared lost p50"]["baseline"] == 50000.0


def test_a_goal_without_runs_says_so() -> None:
    assert goal_line("x", [], goal=1.0) == "goal: x p99 <= 1.0 s: not measured"
