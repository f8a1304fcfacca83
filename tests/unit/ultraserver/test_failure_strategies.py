"""What a workload does when an allocated node goes NotReady, per failure strategy.

The reconciler runs against an in-memory API (workloads, nodes, templates, Events) and the
real allocator (its placement and request handling, without the bus): see ``memory_api``.
"""

from __future__ import annotations

import pytest

from tests.unit.ultraserver.memory_api import World


@pytest.mark.parametrize("strategy", ["ReplaceAffected", "MigrateAffected"])
def test_replace_affected_swaps_only_the_failed_ultraserver(strategy: str) -> None:
    world = World(3, size=4, count=2, strategy=strategy)
    world.reconcile()
    assert world.status["state"] == "Allocated"
    before = world.nodes()
    index0, index1 = before[:4], before[4:]
    world.api.not_ready(index0[1])
    world.reconcile()
    status = world.status
    assert status["state"] == "Allocated", status["message"]
    after = world.nodes()
    assert after[4:] == index1  # the healthy UltraServer keeps its place and ranks
    assert set(after[:4]).isdisjoint(before)
    assert [a["ultraserverIndex"] for a in status["allocations"]] == [0, 1]
    assert world.recorded() == set(after)
    holder = world.allocator.fleet
    assert all(holder.holder(n) == "uid-1" for n in after)
    assert all(holder.holder(n) is None for n in index0)
    # The template's node restriction names the new UltraServer, not the failed one.
    template = world.restricted_to()
    assert "'us0'" not in template
    assert {"'us1'", "'us2'"} <= {s for s in ("'us0'", "'us1'", "'us2'") if s in template}
    assert "Replaced" in world.reasons()
    assert status["topology0Host"] == after[0]


def test_replace_affected_without_room_is_partially_allocated_with_the_reason() -> None:
    world = World(2, size=4, count=2, strategy="ReplaceAffected")
    world.reconcile()
    before = world.nodes()
    world.api.not_ready(before[5])
    world.reconcile()
    status = world.status
    assert status["state"] == "PartiallyAllocated"
    assert "no replacement" in status["message"]
    assert before[5] in status["message"]
    assert world.nodes() == before
    assert world.recorded() == set(before)
    assert all(world.allocator.fleet.holder(n) == "uid-1" for n in before)


def test_replace_affected_pairs_keep_their_shape() -> None:
    world = World(2, size=2, count=2, strategy="ReplaceAffected")
    world.reconcile()
    before = world.nodes()
    world.api.not_ready(before[0])
    world.reconcile()
    status = world.status
    assert status["state"] == "Allocated", status["message"]
    after = world.nodes()
    assert after[2:] == before[2:]
    assert len(after) == 4
    assert before[0] not in after
    assert world.recorded() == set(after)


def test_restart_all_places_the_whole_workload_again() -> None:
    world = World(3, size=4, count=1, strategy="RestartAll")
    world.reconcile()
    before = world.nodes()
    world.api.not_ready(before[2])
    world.reconcile()
    assert world.status["state"] == "Pending"
    assert world.recorded() == set()
    assert world.allocator.fleet.allocation("uid-1") is None
    assert "NodeFailed" in world.reasons()


def test_no_op_only_reports() -> None:
    world = World(3, size=4, count=1, strategy="NoOp")
    world.reconcile()
    before = world.nodes()
    world.api.not_ready(before[0])
    world.reconcile()
    assert world.status["state"] == "PartiallyAllocated"
    assert world.nodes() == before
    assert world.recorded() == set(before)
