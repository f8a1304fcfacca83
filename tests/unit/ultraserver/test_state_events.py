"""Every state a workload moves through is put on the bus once, with what it moved from."""

from __future__ import annotations

from neuron_dra_common.events import WorkloadStateChanged

from tests.unit.ultraserver.memory_api import World


def transitions(world: World) -> list[tuple[str, str]]:
    return [
        (e.previous, e.state) for e, _ in world.published if isinstance(e, WorkloadStateChanged)
    ]


def test_allocation_then_a_failed_node_without_room_is_told_step_by_step() -> None:
    world = World(2, size=4, count=2, strategy="ReplaceAffected")
    world.reconcile()
    assert transitions(world) == [("", "Allocating"), ("Allocating", "Allocated")]
    count = len(world.published)
    world.reconcile()  # nothing changed: nothing published
    assert len(world.published) == count
    before = world.nodes()
    world.api.not_ready(before[5])
    world.reconcile()
    [(event, msg_id)] = world.published[count:]
    assert isinstance(event, WorkloadStateChanged)
    assert (event.previous, event.state) == ("Allocated", "PartiallyAllocated")
    assert event.workload.uid == "uid-1"
    assert event.ultraservers
    assert msg_id.startswith("wl:uid-1:")
