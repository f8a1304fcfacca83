"""What a workload does when an allocated node goes NotReady, per failure strategy.

The reconciler runs against an in-memory API (workloads, nodes, templates, Events) and the
real allocator (its placement and request handling, without the bus).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from neuron_dra_common.events import AnyEvent, Event
from neuron_dra_common.ultraserver import NODE_ALLOCATION, node_allocation
from neuron_dra_topology_allocator.projection import Projection
from neuron_dra_topology_allocator.service import Allocator
from neuron_dra_ultraserver_operator.discovery import Member, UltraServerView
from neuron_dra_ultraserver_operator.reconciler import WorkloadReconciler

Obj = dict[str, Any]
TYPE = "trn2u.48xlarge"
KEY = "ml/train"


class Sink:
    async def publish(self, event: Event, *, msg_id: str | None = None) -> Any:
        return None


class Api:
    """Just enough of the API server for the operator's writes."""

    def __init__(self, servers: int) -> None:
        self.nodes: dict[str, Obj] = {
            f"us{u}-n{i}": {
                "metadata": {"name": f"us{u}-n{i}", "annotations": {}},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]},
            }
            for u in range(servers)
            for i in range(4)
        }
        self.workloads: dict[str, Obj] = {}
        self.templates: dict[str, Obj] = {}
        self.events: list[Obj] = []

    async def request(self, method: str, path: str, **kw: Any) -> Obj:
        body: Obj = kw.get("body") or {}
        parts = path.strip("/").split("/")
        if method == "POST" and parts[-1] == "events":
            self.events.append(body)
        elif "nodes" in parts:
            node = self.nodes[parts[-1]]
            notes = (body["metadata"].get("annotations") or {}).get(NODE_ALLOCATION)
            node["metadata"]["annotations"] = {NODE_ALLOCATION: notes} if notes else {}
        elif "resourceclaimtemplates" in parts:
            self.templates[parts[-1]] = body
        elif "neuronultraserverworkloads" in parts:
            wl = self.workloads[KEY]
            if parts[-1] == "status":
                wl["status"] = body["status"]
            else:
                wl["metadata"]["finalizers"] = body["metadata"].get("finalizers", [])
        return body

    def not_ready(self, node: str) -> None:
        self.nodes[node]["status"]["conditions"] = [{"type": "Ready", "status": "False"}]


def views(servers: int) -> dict[str, UltraServerView]:
    return {
        f"us-{u}": UltraServerView(
            name=f"us-{u}",
            server_id=f"us{u}",
            instance_type=TYPE,
            members=tuple(
                Member(node_name=f"us{u}-n{i}", node_id=i, server_id_2=f"us{u}-p{i // 2}")
                for i in range(4)
            ),
        )
        for u in range(servers)
    }


class World:
    def __init__(self, servers: int, *, size: int, count: int, strategy: str) -> None:
        self.api = Api(servers)
        projection = Projection()
        for u in range(servers):
            for i in range(4):
                projection.fleet.upsert_node(
                    f"us{u}-n{i}",
                    ultraserver=f"us{u}",
                    instance_type=TYPE,
                    node_id=i,
                    server_id_2=f"us{u}-p{i // 2}",
                )
        projection.serving = True
        self.allocator = Allocator(projection, sink=Sink())
        self.api.workloads[KEY] = {
            "metadata": {
                "name": "train",
                "namespace": "ml",
                "uid": "uid-1",
                "generation": 1,
                "finalizers": [],
            },
            "spec": {
                "instanceType": TYPE,
                "topologySize": size,
                "serverCount": count,
                "allocationPolicy": {"failureStrategy": strategy},
            },
        }
        _views = views(servers)

        async def allocate(event: Event) -> AnyEvent:
            return await self.allocator.handle(event)  # type: ignore[arg-type,return-value]

        self.reconciler = WorkloadReconciler(
            client=self.api,  # type: ignore[arg-type]
            workloads=self.api.workloads,
            nodes=self.api.nodes,
            fleet=lambda: _views,
            allocate=allocate,
            changed=lambda names: None,
            requeue=lambda key, after: None,
            released=lambda: None,
        )

    def reconcile(self) -> None:
        asyncio.run(self.reconciler.reconcile(KEY))

    @property
    def status(self) -> Obj:
        return dict(self.api.workloads[KEY].get("status") or {})

    def nodes(self) -> list[str]:
        return [n["nodeName"] for a in self.status["allocations"] for n in a["nodes"]]

    def recorded(self) -> set[str]:
        return {
            name
            for name, node in self.api.nodes.items()
            if node_allocation(name, node["metadata"]["annotations"]) is not None
        }

    def restricted_to(self) -> str:
        return repr(self.api.templates["train"])

    def reasons(self) -> list[str]:
        return [e["reason"] for e in self.api.events]


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
