"""What a workload does when an allocated node goes NotReady, per failure strategy.

The reconciler runs against an in-memory API (workloads, nodes, templates, Events) and the
real allocator (its placement and request handling, without the bus): see ``memory_api``.
"""

from __future__ import annotations

import copy

import pytest

from tests.unit.ultraserver.memory_api import World


@pytest.mark.parametrize("strategy", ["ReplaceAffected", "MigrateAffected"])
def test_replace_affected_swaps_only_the_failed_ultraserver(strategy: str) -> None:
    world = World(3, size=4, count=2, strategy=strategy)
    world.reconcile()
    assert world.status["state"] == "Allocated"
    before = world.nodes()
    index0, index1 = before[:4], before[4:]
    old = world.status["allocations"][0]["ultraServer"]
    world.api.run_pods("train", before)
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
    # The Event names the failed UltraServer and the one that took its place.
    new = status["allocations"][0]["ultraServer"]
    assert new != old
    (message,) = [e["message"] for e in world.api.events if e["reason"] == "Replaced"]
    assert f"UltraServer {old} with {new}" in message, message
    # The pods of the replaced unit are deleted (the one on the failed node at once), so
    # their controller recreates them on the new nodes; the others keep running.
    assert set(world.api.deleted) == {f"pod-{n}" for n in index0}
    assert world.api.deleted[f"pod-{index0[1]}"] == 0
    assert world.api.deleted[f"pod-{index0[0]}"] is None
    assert set(world.api.pods) == {f"pod-{n}" for n in index1}
    assert condition(world, "Ready") == "True"
    assert condition(world, "Degraded") == "False"


def condition(world: World, kind: str) -> str:
    (found,) = [c["status"] for c in world.status["conditions"] if c["type"] == kind]
    return str(found)


def test_replace_affected_of_a_single_ultraserver_moves_to_the_spare() -> None:
    # The run a user makes first: 1 x 4 nodes, one node dies, one UltraServer spare.
    world = World(3, size=4, count=1, strategy="ReplaceAffected")
    world.reconcile()
    before = world.nodes()
    old = world.status["allocations"][0]["ultraServer"]
    world.api.run_pods("train", before)
    world.api.not_ready(before[1])
    world.reconcile()
    status = world.status
    assert status["state"] == "Allocated", status["message"]
    after = world.nodes()
    assert set(after).isdisjoint(before)
    new = status["allocations"][0]["ultraServer"]
    assert new != old
    assert [e["message"] for e in world.api.events if e["reason"] == "Replaced"] == [
        f"replaced UltraServer {old} with {new} (ultraserverIndex 0; nodes "
        f"{', '.join(before)} -> {', '.join(after)})"
    ]
    assert world.api.pods == {}
    # Settled: more passes change nothing (no flapping back and forth).
    events = len(world.api.events)
    for _ in range(3):
        world.reconcile()
    assert world.nodes() == after
    assert len(world.api.events) == events


def test_a_node_declared_lost_is_replaced_before_kubernetes_calls_it_not_ready() -> None:
    world = World(3, size=4, count=1, strategy="ReplaceAffected")
    world.reconcile()
    before = world.nodes()
    world.lose(before[2])
    world.reconcile()
    after = world.nodes()
    assert world.status["state"] == "Allocated", world.status["message"]
    assert set(after).isdisjoint(before)
    assert any("lost" in e["message"] for e in world.api.events if e["reason"] == "NodeFailed")


def test_no_replacement_says_so_and_recovers_when_capacity_appears() -> None:
    world = World(2, size=4, count=1, strategy="ReplaceAffected")
    world.reconcile()
    before = world.nodes()
    spare = [n for n in world.api.nodes if n not in before]
    world.api.not_ready(spare[0])  # the only other UltraServer is unhealthy too
    world.api.not_ready(before[0])
    world.reconcile()
    assert world.status["state"] == "PartiallyAllocated"
    assert world.status["reason"] == "NoReplacement"
    assert condition(world, "Ready") == "False"
    assert condition(world, "Degraded") == "True"
    assert world.nodes() == before  # never the unhealthy spare, nor the failed one again
    world.api.ready(spare[0])
    world.reconcile()
    assert world.status["state"] == "Allocated"
    assert world.nodes() == spare


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
    world.api.run_pods("train", before)
    world.api.not_ready(before[2])
    world.reconcile()
    assert world.status["state"] == "Pending"
    assert world.recorded() == set()
    assert world.allocator.fleet.allocation("uid-1") is None
    assert "NodeFailed" in world.reasons()
    # Every pod goes (the one on the failed node at once), and the template with them.
    assert world.api.pods == {}
    assert world.api.deleted[f"pod-{before[2]}"] == 0
    assert "train" not in world.api.templates
    world.reconcile()  # the next pass places it anew, away from the failed UltraServer
    assert world.status["state"] == "Allocated"
    assert set(world.nodes()).isdisjoint(before)
    assert "train" in world.api.templates


def test_no_op_only_reports() -> None:
    world = World(3, size=4, count=1, strategy="NoOp")
    world.reconcile()
    before = world.nodes()
    world.api.not_ready(before[0])
    world.reconcile()
    assert world.status["state"] == "PartiallyAllocated"
    assert world.nodes() == before
    assert world.recorded() == set(before)
    assert condition(world, "Degraded") == "True"
    assert condition(world, "Ready") == "False"
    assert "NodeFailed" in world.reasons()


def test_a_waiting_pod_whose_claim_takes_the_replaced_nodes_is_made_again() -> None:
    world = World(3, size=4, count=1, strategy="ReplaceAffected")
    world.reconcile()
    before = world.nodes()
    world.api.run_pods("train", before[:3])
    # Kubernetes evicted the pod of the failing node and its controller made it again; its
    # claim was made from the template that still named the old nodes, so it waits for them.
    template = world.api.templates["train"]
    world.api.claims["again-n"] = {
        "metadata": {"name": "again-n", "labels": dict(template["metadata"]["labels"])},
        "spec": {"devices": copy.deepcopy(template["spec"]["spec"]["devices"])},
    }
    world.api.pods["again"] = {
        "metadata": {"name": "again", "namespace": "ml"},
        "spec": {"resourceClaims": [{"name": "n", "resourceClaimTemplateName": "train"}]},
        "status": {"resourceClaimStatuses": [{"name": "n", "resourceClaimName": "again-n"}]},
    }
    world.lose(before[3])
    world.reconcile()
    assert world.status["state"] == "Allocated", world.status["message"]
    assert set(world.api.deleted) == {"again", *(f"pod-{n}" for n in before[:3])}
