"""Replacing the affected units of an allocation: same shape, all or nothing."""

from __future__ import annotations

from neuron_dra_topology_allocator.placement import Fleet, Request
from neuron_dra_topology_allocator.replacement import replace

from tests.unit.allocator.test_placement import fleet, req


def _place(f: Fleet, r: Request) -> tuple[str, ...]:
    decision = f.place(r)
    assert decision.allocation is not None
    return decision.allocation.nodes


def test_only_the_affected_ultraserver_is_replaced_and_keeps_its_index() -> None:
    f = fleet(4)
    r = req("w", 4, 2)
    _place(f, r)
    held = f.allocation("w")
    assert held is not None
    first, second = held.grants
    decision = replace(f, req("w", 4, 2, exclude=frozenset({first.ultraserver})), (second,))
    assert decision.granted
    assert decision.allocation is not None
    new, kept = decision.allocation.grants
    assert kept == second
    assert new.index == first.index == 0
    assert new.ultraserver not in (first.ultraserver, second.ultraserver)
    assert len(new.nodes) == 4
    assert new.mode == first.mode
    # The failed UltraServer's nodes are free again; the new ones are held by the workload.
    assert all(f.holder(n) is None for n in first.nodes)
    assert all(f.holder(n) == "w" for n in new.nodes + kept.nodes)


def test_pairs_are_replaced_with_pairs() -> None:
    f = fleet(3)
    _place(f, req("w", 2, 2))
    held = f.allocation("w")
    assert held is not None
    broken, kept = held.grants
    decision = replace(f, req("w", 2, 2, exclude=frozenset({broken.ultraserver})), (kept,))
    assert decision.allocation is not None
    grants = decision.allocation.grants
    assert [g.index for g in grants] == [0, 1]
    assert grants[1] == kept
    assert len(grants[0].nodes) == 2
    assert grants[0].ultraserver != broken.ultraserver


def test_no_replacement_fits_keeps_everything_as_it_was() -> None:
    f = fleet(3)
    _place(f, req("w", 4, 2))
    _place(f, req("other", 4, 1))
    before = f.allocation("w")
    assert before is not None
    free = f.free_nodes()
    first, second = before.grants
    decision = replace(f, req("w", 4, 2, exclude=frozenset({first.ultraserver})), (second,))
    assert not decision.granted
    assert decision.reason.startswith("no replacement fits")
    assert f.allocation("w") == before
    assert f.free_nodes() == free


def test_kept_nodes_held_by_another_workload_are_refused() -> None:
    f = fleet(3)
    other = _place(f, req("other", 4, 1))
    _place(f, req("w", 4, 1))
    held = f.allocation("w")
    theirs = f.allocation("other")
    assert held is not None
    assert theirs is not None
    decision = replace(f, req("w", 4, 2), theirs.grants)
    assert not decision.granted
    assert other[0] in decision.reason
    assert f.allocation("w") == held
