"""A workload never takes what another one holds: nodes Kubernetes records as another
workload's, or a ResourceClaimTemplate it does not own; and it deletes only its own pods.

The reconciler runs against the in-memory API and the real allocator (see ``memory_api``);
the allocator here starts without any history, as after a restart that lost its stream.
"""

from __future__ import annotations

import asyncio
from typing import Any

from neuron_dra_common.events import AllocationDecided, ObjectRef, UltraServerGrant
from neuron_dra_common.ultraserver import (
    NODE_ALLOCATION,
    WORKLOAD_UID_LABEL,
    NodeAllocation,
    encode_node_allocation,
    node_allocation,
)
from neuron_dra_topology_allocator.placement import Request
from neuron_dra_ultraserver_operator.actions import NodeWrite, Together, WriteNodeRecords
from neuron_dra_ultraserver_operator.decide import decide
from neuron_dra_ultraserver_operator.inputs import Facts, FleetView, Held, Owner, Refusal
from neuron_dra_ultraserver_operator.model import workload_from_api
from neuron_dra_ultraserver_operator.ownership import owners

from tests.unit.ultraserver.memory_api import KEY, World

Obj = dict[str, Any]
OTHER_UID = "uid-other"
US0 = [f"us0-n{i}" for i in range(4)]


def record(node_id: int, *, uid: str = OTHER_UID, workload: str = "ml/other") -> NodeAllocation:
    return NodeAllocation(
        workload=workload,
        workload_uid=uid,
        workload_id=workload.partition("/")[2],
        phase="Bound",
        nodes=4,
        mode=1,
        server_id="us0",
        node_id=node_id,
        topo_id=node_id,
        topo0_host="us0-n0",
        ultraserver="us-us0",
    )


def other_workload(*, created: str = "2026-01-01T00:00:00Z", nodes: list[str] = US0) -> Obj:
    """A workload that holds ``nodes`` (one UltraServer) in its status."""
    return {
        "metadata": {
            "name": "other",
            "namespace": "ml",
            "uid": OTHER_UID,
            "generation": 1,
            "creationTimestamp": created,
        },
        "spec": {"instanceType": "trn2u.48xlarge", "topologySize": 4, "serverCount": 1},
        "status": {
            "state": "Allocated",
            "allocations": [
                {
                    "ultraServer": "us-us0",
                    "serverId": "us0",
                    "ultraserverIndex": 0,
                    "mode": 1,
                    "leaderNodeName": nodes[0],
                    "nodes": [
                        {"nodeName": n, "nodeId": i, "topologyId": i} for i, n in enumerate(nodes)
                    ],
                }
            ],
        },
    }


def hold_us0(world: World) -> None:
    """``ml/other`` holds UltraServer us0 in Kubernetes (status and node records); the
    allocator does not know (its history is lost)."""
    world.api.workloads["ml/other"] = other_workload()
    for i, node in enumerate(US0):
        world.api.nodes[node]["metadata"]["annotations"][NODE_ALLOCATION] = encode_node_allocation(
            record(i)
        )


def test_a_replacement_is_never_taken_from_another_workloads_nodes() -> None:
    world = World(2, size=4, count=1, strategy="ReplaceAffected")
    world.reconcile()
    assert world.nodes() == US0
    # ml/other holds us1 in Kubernetes; the allocator does not know (history lost).
    us1 = [f"us1-n{i}" for i in range(4)]
    other = other_workload(nodes=us1)
    other["status"]["allocations"][0]["ultraServer"] = "us-us1"
    world.api.workloads["ml/other"] = other
    for i, node in enumerate(us1):
        world.api.nodes[node]["metadata"]["annotations"][NODE_ALLOCATION] = encode_node_allocation(
            record(i)
        )
    world.api.not_ready("us0-n1")
    world.reconcile()
    status = world.status
    assert status["reason"] == "NoReplacement", status
    assert world.nodes() == US0
    assert "another workload holds: us1-n0, us1-n1, us1-n2, us1-n3" in status["message"]
    assert all(
        node_allocation(n, world.api.nodes[n]["metadata"]["annotations"]) == record(i)
        for i, n in enumerate(us1)
    )
    assert "ml/other" in world.requeued


def test_records_left_by_a_workload_that_is_gone_are_written_over() -> None:
    world = World(1, size=4, count=1, strategy="NoOp")
    for i, node in enumerate(US0):
        left = record(i, uid="uid-gone", workload="ml/gone")
        world.api.nodes[node]["metadata"]["annotations"][NODE_ALLOCATION] = encode_node_allocation(
            left
        )
    world.reconcile()
    assert world.status["state"] == "Allocated"
    for node in US0:
        held = node_allocation(node, world.api.nodes[node]["metadata"]["annotations"])
        assert held is not None
        assert held.workload == KEY


def test_owners_come_from_node_records_then_the_oldest_status() -> None:
    mine = workload_from_api(
        {
            **other_workload(created="2026-02-01T00:00:00Z", nodes=["a", "b", "c", "d"]),
            "metadata": {
                "name": "mine",
                "namespace": "ml",
                "uid": "uid-mine",
                "creationTimestamp": "2026-02-01T00:00:00Z",
            },
        }
    )
    older = workload_from_api(other_workload(nodes=["c", "d", "e", "f"]))
    gone = Held(record=record(0, uid="uid-deleted", workload="ml/deleted"))
    held = owners(
        [mine, older],
        {"a": Held(record=record(0)), "b": Held(record=record(1, uid="uid-mine")), "e": gone},
    )
    # A Node's record wins over any status; without one, the older workload's status.
    assert held["a"].key == "ml/other"
    assert held["b"].key == "ml/mine"
    assert held["c"].key == "ml/other"
    assert held["c"].by == "status"
    assert held["f"].key == "ml/other"
    # The record of a workload that no longer exists holds nothing: its status decides.
    assert held["e"].key == "ml/other"


def test_a_workload_being_deleted_holds_by_its_node_records_only() -> None:
    leaving = other_workload()
    leaving["metadata"]["deletionTimestamp"] = "2026-03-01T00:00:00Z"
    held = owners([workload_from_api(leaving)], {"us0-n0": Held(record=record(0))})
    assert set(held) == {"us0-n0"}


def test_an_allocator_without_history_never_hands_another_workloads_nodes_over() -> None:
    world = World(1, size=4, count=1, strategy="NoOp")
    hold_us0(world)
    for _ in range(3):
        world.reconcile()
        status = world.status
        assert status["state"] == "Pending"
        assert status["reason"] == "AllocationConflict"
        assert status["allocations"] == []
        # The other workload's records stay as they were.
        for i, node in enumerate(US0):
            notes = world.api.nodes[node]["metadata"]["annotations"]
            assert node_allocation(node, notes) == record(i)
        # The grant was given back: the allocator holds nothing for this workload.
        assert world.allocator.fleet.allocation("uid-1") is None
    (message, *_) = [e["message"] for e in world.api.events if e["reason"] == "AllocationConflict"]
    assert "us0-n0, us0-n1, us0-n2, us0-n3 (NeuronUltraServerWorkload ml/other)" in message
    assert "ml/other" in world.requeued


def test_a_workload_whose_status_names_anothers_nodes_gives_them_back() -> None:
    world = World(2, size=4, count=1, strategy="NoOp")
    hold_us0(world)
    # Written before the fix: this workload's status names us0 too, and one node's record.
    mine = other_workload(created="2026-05-01T00:00:00Z")["status"]
    world.api.workloads[KEY]["status"] = mine
    world.api.workloads[KEY]["metadata"]["creationTimestamp"] = "2026-05-01T00:00:00Z"
    world.reconcile()
    status = world.status
    assert status["state"] == "Pending", status
    assert status["reason"] == "AllocationConflict"
    assert all(
        node_allocation(n, world.api.nodes[n]["metadata"]["annotations"]) == record(i)
        for i, n in enumerate(US0)
    )
    # The owner, rechecked at once, confirms what it holds; asked again, this workload is
    # placed on the free UltraServer.
    assert "ml/other" in world.requeued
    asyncio.run(world.reconciler.reconcile("ml/other"))
    world.reconcile()
    assert world.status["state"] == "Allocated"
    assert set(world.nodes()).isdisjoint(US0)


def test_the_owner_keeps_its_nodes_when_the_allocator_disagrees() -> None:
    world = World(1, size=4, count=1, strategy="NoOp")
    world.reconcile()
    assert world.status["state"] == "Allocated"
    # The allocator lost its history and handed the UltraServer to a workload that has
    # not given it back yet: the owner's confirmation is refused.
    world.allocator.fleet.release("uid-1")
    intruder = Request(workload="ml/x", uid="uid-x", size=4)
    assert world.allocator.fleet.place(intruder).granted
    world.reconcile()
    assert world.status["state"] == "Allocated"
    assert world.recorded() == set(US0)
    assert "AllocatorDisagrees" in world.reasons()


def test_a_node_taken_after_the_cache_was_read_is_refused_not_overwritten() -> None:
    world = World(1, size=4, count=1, strategy="NoOp")
    wl = workload_from_api(world.api.workloads[KEY])
    # The API holds another workload's record; the write was decided from a stale view.
    notes = world.api.nodes["us0-n2"]["metadata"]["annotations"]
    notes[NODE_ALLOCATION] = encode_node_allocation(record(2))
    mine = record(2, uid="uid-1", workload=KEY)
    executor = world.reconciler._executor
    writes = tuple(NodeWrite(node=n, record=mine) for n in ("us0-n2",))
    facts = asyncio.run(
        executor.perform(wl, [WriteNodeRecords(writes=writes)], Facts(now="2026-01-01T00:00:00Z"))
    )
    assert facts.refused == Refusal(kind="Node", name="us0-n2", holder="ml/other")
    assert node_allocation("us0-n2", notes) == record(2)
    # Clearing never removes another workload's record either.
    clear = (NodeWrite(node="us0-n2", record=None),)
    asyncio.run(executor.perform(wl, [WriteNodeRecords(writes=clear)], facts))
    assert node_allocation("us0-n2", notes) == record(2)


def test_a_template_of_the_same_name_that_is_not_the_workloads_is_left_alone() -> None:
    world = World(1, size=4, count=1, strategy="NoOp")
    theirs = {
        "metadata": {
            "name": "train",
            "namespace": "ml",
            "labels": {WORKLOAD_UID_LABEL: OTHER_UID},
            "ownerReferences": [
                {
                    "kind": "NeuronUltraServerWorkload",
                    "name": "other",
                    "uid": OTHER_UID,
                    "controller": True,
                }
            ],
        },
        "spec": {"spec": {"devices": {"requests": []}}},
    }
    world.api.templates["train"] = theirs
    world.reconcile()
    assert world.api.templates["train"] is theirs
    status = world.status
    assert status["state"] != "Allocated"
    assert status["reason"] == "TemplateConflict"
    (message,) = {e["message"] for e in world.api.events if e["reason"] == "TemplateConflict"}
    assert "ResourceClaimTemplate ml/train" in message
    assert "NeuronUltraServerWorkload other" in message


def test_deleting_a_workload_deletes_only_its_own_pods() -> None:
    world = World(1, size=4, count=1, strategy="NoOp")
    world.reconcile()
    assert world.status["state"] == "Allocated"
    world.api.run_pods("train", US0[:2])
    # Pods of another workload use a template of the same name (made before, elsewhere):
    # their claims carry the other workload's UID.
    world.api.run_pods("train", US0[2:])
    for node in US0[2:]:
        world.api.claims[f"pod-{node}-n"]["metadata"]["labels"][WORKLOAD_UID_LABEL] = OTHER_UID
    world.api.workloads[KEY]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    world.api.workloads[KEY]["metadata"]["finalizers"] = ["neuron.aws.com/ultraserver-operator"]
    world.reconcile()
    assert set(world.api.deleted) == {f"pod-{n}" for n in US0[:2]}
    assert set(world.api.pods) == {f"pod-{n}" for n in US0[2:]}


def test_a_grant_of_held_nodes_is_refused_by_the_decider() -> None:
    wl = workload_from_api(
        {
            "metadata": {"name": "train", "namespace": "ml", "uid": "uid-1"},
            "spec": {"instanceType": "trn2u.48xlarge", "topologySize": 4, "serverCount": 1},
        }
    )
    fleet = FleetView(members={}, names={}, server_ids={}, servers={}, ready={})
    answer = AllocationDecided(
        request_id="r",
        workload=ObjectRef(namespace="ml", name="train", uid="uid-1"),
        granted=True,
        nodes=tuple(US0),
        grants=(UltraServerGrant(ultraserver="us-us0", index=0, nodes=tuple(US0)),),
    )
    held = {n: Owner(uid=OTHER_UID, key="ml/other") for n in US0}
    actions = decide(wl, fleet, {}, Facts(now="2026-01-01T00:00:00Z", answer=answer, owners=held))
    # The actions performed together count as any other.
    kinds = [
        type(one).__name__
        for a in actions
        for one in (a.actions if isinstance(a, Together) else (a,))
    ]
    assert "WriteNodeRecords" not in kinds
    assert "ApplyTemplate" not in kinds
    assert kinds[:2] == ["Emit", "Release"]
    assert "Recheck" in kinds
    assert kinds[-1] == "Requeue"
