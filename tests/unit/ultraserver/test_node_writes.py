"""The allocation records the operator writes on Nodes: compare-and-set from the copy of the
Node it has (one request a node and phase), a fresh read only when that copy was old.

The reconciler runs against an in-memory API whose Nodes carry a resourceVersion and refuse
a write that names another one (409), as the apiserver does: see ``memory_api``.
"""

from __future__ import annotations

import copy
from typing import Any

from neuron_dra_common.ultraserver import (
    NODE_ALLOCATION,
    NodeAllocation,
    encode_node_allocation,
    node_allocation,
)

from tests.unit.ultraserver.memory_api import KEY, Api, World


def node_calls(world: World, method: str) -> list[str]:
    return [path for m, path in world.api.calls if m == method and "/nodes/" in path]


def test_a_placement_writes_each_record_without_reading_the_node_first() -> None:
    world = World(3, size=4, count=1, strategy="ReplaceAffected")
    world.reconcile()
    assert world.status["state"] == "Allocated"
    assert world.recorded() == set(world.nodes())
    # Pending, then Bound, on each of the four nodes: eight writes and no read.
    assert len(node_calls(world, "PATCH")) == 8
    assert node_calls(world, "GET") == []


def test_a_replacement_clears_and_writes_records_without_reading_nodes() -> None:
    world = World(3, size=4, count=1, strategy="ReplaceAffected")
    world.reconcile()
    before = world.nodes()
    world.api.not_ready(before[1])
    world.api.calls.clear()
    world.reconcile()
    assert world.status["state"] == "Allocated", world.status["message"]
    after = world.nodes()
    assert set(after).isdisjoint(before)
    assert world.recorded() == set(after)
    # Four records cleared, four new nodes written Pending then Bound.
    assert len(node_calls(world, "PATCH")) == 12
    assert node_calls(world, "GET") == []


def test_an_old_copy_of_a_node_costs_one_read_and_the_record_is_still_written() -> None:
    cache: dict[str, Any] = {}

    def stale(api: Api) -> dict[str, Any]:
        cache.update(copy.deepcopy(api.nodes))
        return cache

    world = World(2, size=4, count=1, strategy="ReplaceAffected", node_cache=stale)
    # Another writer changed every Node since the informer's copy.
    for name in world.api.nodes:
        world.api.touch(name)
    world.reconcile()
    assert world.status["state"] == "Allocated", world.status["message"]
    assert world.recorded() == set(world.nodes())
    # The Pending write of each node is refused once (409) and made after a fresh read; the
    # Bound write starts from the Node the Pending write returned.
    assert len(node_calls(world, "GET")) == 4
    assert len(node_calls(world, "PATCH")) == 12


def test_a_record_written_since_the_copy_was_taken_is_never_overwritten() -> None:
    cache: dict[str, Any] = {}
    world = World(1, size=4, count=1, strategy="ReplaceAffected", node_cache=lambda api: cache)
    cache.update(copy.deepcopy(world.api.nodes))
    node = "us0-n0"
    # The informer last saw a record of a workload that is gone (a record that may be
    # written over); since then another workload recorded the node as its own.
    cache[node]["metadata"]["annotations"][NODE_ALLOCATION] = record("ml/gone", "uid-gone")
    live = world.api.nodes[node]["metadata"]
    live["annotations"][NODE_ALLOCATION] = record("ml/other", "uid-other")
    world.api.touch(node)
    world.reconcile()
    assert node_allocation(node, live["annotations"]) == decode(record("ml/other", "uid-other"))
    assert world.status["state"] == "Pending"
    assert "AllocationConflict" in world.reasons()


def record(workload: str, uid: str) -> str:
    return encode_node_allocation(
        NodeAllocation(
            workload=workload,
            workload_uid=uid,
            workload_id=workload.partition("/")[2],
            phase="Bound",
            nodes=4,
            mode=3,
            server_id="us0",
            node_id=0,
            topo_id=0,
            topo0_host="us0-n0",
        )
    )


def decode(raw: str) -> NodeAllocation | None:
    return node_allocation("us0-n0", {NODE_ALLOCATION: raw})


def test_an_informer_that_shows_an_earlier_write_of_the_operator_costs_no_read() -> None:
    # The informer lags: it has shown the Pending write of each node, not the Bound write
    # that followed it. That copy is older than the one the operator wrote last, so the
    # release starts from the operator's own copy: no 409, no read.
    cache: dict[str, Any] = {}
    world = World(1, size=4, count=1, strategy="ReplaceAffected", node_cache=lambda api: cache)
    cache.update(copy.deepcopy(world.api.nodes))
    world.reconcile()
    assert world.status["state"] == "Allocated"
    for name, node in world.api.nodes.items():
        echo = copy.deepcopy(node)
        echo["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) - 1)
        cache[name] = echo
    world.api.calls.clear()
    world.api.workloads[KEY]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    world.reconcile()
    assert world.recorded() == set()
    assert node_calls(world, "GET") == []
    assert len(node_calls(world, "PATCH")) == 4


def test_another_writer_right_after_each_write_costs_no_read() -> None:
    # The informer (here always current) shows another writer's version of the Node (a
    # kubelet's status) as soon as the operator's write returns: that version is newer than
    # the operator's copy, so the next write starts from the informer's, not a refused one.
    world = World(1, size=4, count=1, strategy="ReplaceAffected")
    patch = world.api.request

    async def then_another_write(method: str, path: str, **kw: Any) -> Any:
        out = await patch(method, path, **kw)
        if method == "PATCH" and "/nodes/" in path:
            world.api.touch(path.rsplit("/", 1)[-1])
        return out

    world.api.request = then_another_write  # type: ignore[method-assign]
    world.reconcile()
    assert world.status["state"] == "Allocated", world.status["message"]
    assert world.recorded() == set(world.nodes())
    assert node_calls(world, "GET") == []
    assert len(node_calls(world, "PATCH")) == 8
