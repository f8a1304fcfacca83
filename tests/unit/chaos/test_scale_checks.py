"""The chaos checks at fleet scale (``bench scale --chaos``): what keeps a simulated fleet from
having converged, and the verdict the report prints."""

from __future__ import annotations

from chaos.scale import ChaosOutcome, converge_problems
from tests.unit.chaos.test_fleet_checks import ALL16, node, piece

ULTRA = (*ALL16, "neuronnode")


def workload(name: str, state: str | None, *, deleting: bool = False) -> dict[str, object]:
    meta: dict[str, object] = {"name": name, "namespace": "chaos-scale"}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-28T19:00:00Z"
    return {"metadata": meta, "status": {"state": state} if state else {}}


def test_a_converged_fleet_has_no_problem() -> None:
    nodes = [node("u0", "trn2u.48xlarge"), node("u1", "trn2u.48xlarge")]
    slices = [piece("u0", *ULTRA), piece("u1", *ULTRA)]
    assert (
        converge_problems(nodes=nodes, slices=slices, workloads=[workload("w", "Allocated")]) == []
    )


def test_a_dropped_pool_a_taint_left_and_a_pending_workload_each_keep_it_unconverged() -> None:
    nodes = [node("u0", "trn2u.48xlarge"), node("u1", "trn2u.48xlarge")]
    slices = [piece("u0", *ULTRA, tainted=("neurondevice3",))]
    problems = converge_problems(
        nodes=nodes,
        slices=slices,
        workloads=[
            workload("w1", "Pending"),
            workload("w2", None),
            workload("w3", "Allocated", deleting=True),
        ],
    )
    assert problems == [
        "node u1 offers no ResourceSlice pool (17 devices expected)",
        "u0/neurondevice3 still tainted k:NoSchedule",
        "workload w1 Pending",
        "workload w2 None",
        "workload w3 still being deleted",
    ]


def test_the_outcome_is_met_only_without_violations_and_once_converged() -> None:
    out = ChaosOutcome(
        nodes=1000,
        steps=["created workload churn-001", "killed topology-allocator"],
        checks=2,
        converged_s=12.0,
    )
    assert out.ok()
    assert out.lines()[0].startswith(
        "chaos at 1,000 nodes: met: 2 steps (created 1, killed 1), 2 checks, 0 violations; converged 12 s"
    )
    held = ChaosOutcome(
        nodes=1000, violations=["node u0 held by a and b (after created workload w)"]
    )
    assert not held.ok()
    assert "  VIOLATION node u0 held by a and b (after created workload w)" in held.lines()
    stuck = ChaosOutcome(nodes=1000, unconverged=["node u1 offers no ResourceSlice pool"])
    assert not stuck.ok()
    assert "did NOT converge" in stuck.lines()[0]
    assert stuck.as_json()["met"] is False
