"""A replacement stopped at any of its writes resumes from the workload's status and
converges: the workload Allocated on the spare UltraServer, records on exactly its new nodes
(the failed UltraServer's removed, although the status no longer names those nodes), the
allocator and the template agreeing, the failed unit's pods gone.

The replacement writes the status (Allocating, with the new nodes) first; the records of the
nodes given up are removed in the same round as the new nodes get theirs, so a stop between
those writes leaves some of each. The reconciler runs against the in-memory API and the real
allocator (see ``memory_api``); a crash point raises, and a new reconciler (nothing
remembered) takes over, as a restarted operator would.
"""

from __future__ import annotations

import pytest
from neuron_dra_ultraserver_operator.faults import STEPS

from tests.unit.ultraserver.memory_api import World


class Crashed(BaseException):
    """The operator died at a crash point (nothing after it runs)."""


class CrashAt:
    """A crash point armed after the first allocation, at ``step``."""

    def __init__(self) -> None:
        self.step = ""

    def __call__(self, step: str) -> None:
        if step == self.step:
            raise Crashed(step)


def allocated(crash: CrashAt) -> tuple[World, list[str]]:
    world = World(3, size=4, count=1, strategy="ReplaceAffected", crash=crash)
    world.reconcile()
    before = world.nodes()
    assert world.status["state"] == "Allocated"
    world.api.run_pods("train", before)
    return world, before


def assert_converged(world: World, before: list[str]) -> None:
    world.restart()
    world.reconcile()
    status = world.status
    assert status["state"] == "Allocated", status["message"]
    after = world.nodes()
    assert set(after).isdisjoint(before)
    assert world.recorded() == set(after)
    assert all(world.allocator.fleet.holder(n) == "uid-1" for n in after)
    assert all(world.allocator.fleet.holder(n) is None for n in before)
    # The template restricts claims to the new UltraServer (by the id its devices carry).
    template = world.restricted_to()
    assert f"'{after[0].split('-')[0]}'" in template
    assert "'us0'" not in template
    assert world.api.pods == {}
    # Settled: another pass moves nothing.
    world.reconcile()
    assert (world.status["state"], world.nodes(), world.recorded()) == (
        "Allocated",
        after,
        set(after),
    )


@pytest.mark.parametrize("step", [s for s in STEPS if s.startswith("allocate:")][1:])
def test_a_replacement_killed_at_any_write_converges(step: str) -> None:
    crash = CrashAt()
    world, before = allocated(crash)
    crash.step = step
    world.lose(before[1])
    with pytest.raises(Crashed):
        world.reconcile()
    assert world.status["state"] == ("Allocated" if step == "allocate:allocated" else "Allocating")
    if step == "allocate:recorded":
        # Killed right after the status: the failed UltraServer's nodes still carry the
        # workload's records, and only they say so.
        assert world.recorded() == set(before)
        assert not set(world.nodes()) & set(before)
    assert_converged(world, before)


def test_a_replacement_stopped_between_its_concurrent_node_writes_converges() -> None:
    world, before = allocated(CrashAt())
    # The round that clears the old nodes and marks the new ones Pending: one old node's
    # write does not land (the pass stops there), the others do.
    world.api.failing = {before[0]}
    world.lose(before[1])
    with pytest.raises(Exception, match="internal error"):
        world.reconcile()
    new = world.nodes()
    assert world.status["state"] == "Allocating"
    assert world.recorded() == {before[0], *new}
    world.api.failing = set()
    assert_converged(world, before)
