"""Placement: units, preferences, all-or-nothing, reasons, and properties under any history."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from neuron_dra_topology_allocator.placement import (
    UNITS,
    Fleet,
    PlacementError,
    Request,
    Strategy,
)

TYPE = "trn2u.48xlarge"


def fleet(servers: int, *, modes: tuple[int, ...] = (1, 2, 3, 4), order: int = 0) -> Fleet:
    f = Fleet()
    members = [(u, i) for u in range(servers) for i in range(4)]
    if order:
        random.Random(order).shuffle(members)
    for u, i in members:
        f.upsert_node(
            f"us{u}-n{i}",
            ultraserver=f"us{u}",
            instance_type=TYPE,
            node_id=i,
            modes=modes,
            server_id_2=f"us{u}-pair{i // 2}",
            server_id=f"{u:016x}",
        )
    return f


def req(uid: str, size: int, count: int = 1, **kw: object) -> Request:
    return Request(workload=f"ml/{uid}", uid=uid, size=size, count=count, **kw)  # type: ignore[arg-type]


def test_four_node_units_take_whole_ultraservers_with_mode_1() -> None:
    f = fleet(3)
    d = f.place(req("a", 4, 2))
    assert d.allocation is not None
    assert [g.ultraserver for g in d.allocation.grants] == ["us0", "us1"]
    assert [g.index for g in d.allocation.grants] == [0, 1]
    assert all(g.mode == 1 for g in d.allocation.grants)
    assert d.allocation.grants[0].nodes == ("us0-n0", "us0-n1", "us0-n2", "us0-n3")
    # NEURON_RT_ULTRASERVER_SERVER_ID: the driver's id of the UltraServer, not its CR's name.
    assert [g.server_id for g in d.allocation.grants] == [f"{0:016x}", f"{1:016x}"]


def test_two_node_units_prefer_vertical_pairs_then_horizontal() -> None:
    f = fleet(1)
    first = f.place(req("a", 2))
    assert first.allocation is not None
    assert first.allocation.grants[0].node_ids == (0, 1)
    assert first.allocation.grants[0].mode == 3
    assert first.allocation.grants[0].server_id == "us0-pair0"
    f2 = fleet(1, modes=(1, 2, 4))  # vertical links down: horizontal only
    d = f2.place(req("b", 2))
    assert d.allocation is not None
    assert d.allocation.grants[0].node_ids == (0, 2)
    assert d.allocation.grants[0].mode == 2


def test_best_fit_fills_partly_used_ultraservers_first() -> None:
    f = fleet(2)
    assert f.place(req("one", 1)).granted
    d = f.place(req("two", 1))
    assert d.allocation is not None
    # The second single node goes beside the first (its vertical pair), not to us1.
    assert d.allocation.grants[0].nodes == ("us0-n1",)
    assert f.place(req("whole", 4)).allocation is not None


def test_first_fit_fragments_where_best_fit_does_not() -> None:
    outcomes = {}
    for strategy in Strategy:
        f = fleet(2)
        for uid, size in (("x", 4), ("y", 2), ("z", 1)):
            assert f.place(req(uid, size), strategy=strategy).granted
        f.release("x")  # us0 whole and free, us1 with one node left
        assert f.place(req("w", 1), strategy=strategy).granted
        outcomes[strategy] = f.place(req("big", 4), strategy=strategy).granted
    assert outcomes == {Strategy.BEST_FIT: True, Strategy.FIRST_FIT: False}


def test_all_or_nothing_and_reasons_per_ultraserver() -> None:
    f = fleet(2)
    assert f.place(req("a", 4)).granted
    f.set_health("us1-n2", healthy=False, reason="NeuronHasError_DMA_ERROR")
    before = f.free_nodes()
    d = f.place(req("b", 4, 2))
    assert not d.granted
    assert f.free_nodes() == before
    assert f.allocation("b") is None
    codes = {r.ultraserver: r.code for r in d.refusals}
    assert codes == {"us0": "taken", "us1": "too-few-healthy-nodes"}
    assert "us0: 0 of 4 nodes free, the rest taken by workload ml/a" in d.reason
    assert "us1-n2 NeuronHasError_DMA_ERROR" in d.reason
    assert d.reason.startswith("needs 2 x 4-node units, 0 available")


def test_mode_not_supported_is_named() -> None:
    f = fleet(1, modes=(2, 3, 4))  # no 4-node mode: a NeuronLink is down
    d = f.place(req("a", 4))
    assert not d.granted
    assert d.refusals[0].code == "mode-not-supported"
    assert "4-node mode not supported" in d.reason


def test_instance_type_and_exclusion() -> None:
    f = fleet(2)
    assert not f.place(req("a", 4, instance_type="trn3.48xlarge")).granted
    d = f.place(req("b", 4, exclude=frozenset({"us0"})))
    assert d.allocation is not None
    assert d.allocation.grants[0].ultraserver == "us1"


def test_any_name_of_an_instance_type_finds_its_ultraservers() -> None:
    # AWS's operator guide asks for a "Trn3pds" instance type; the catalog calls it
    # trn3.48xlarge. Whatever name the nodes report and the workload gives, they match.
    f = Fleet()
    for i in range(4):
        f.upsert_node(f"n{i}", ultraserver="us0", instance_type="trn3pds.48xlarge", node_id=i)
    for n, name in enumerate(("trn3pds.48xlarge", "Trn3pds", "trn3.48xlarge")):
        d = f.place(req(f"w{n}", 1, instance_type=name))
        assert d.granted, (name, d.reason)
    refused = f.place(req("other", 1, instance_type="trn2u.48xlarge"))
    assert not refused.granted
    assert "trn2u.48xlarge" in refused.reason


def test_repeated_request_returns_the_same_allocation() -> None:
    f = fleet(3)
    first = f.place(req("a", 2, 2))
    again = f.place(req("a", 2, 2))
    assert first.allocation == again.allocation
    assert f.free_nodes() == 8


def test_bad_requests_name_the_field() -> None:
    f = fleet(1)
    with pytest.raises(PlacementError, match=r"ml/a: spec.topologySize 3 is not one of 1, 2, 4"):
        f.place(req("a", 3))
    with pytest.raises(PlacementError, match=r"spec.serverCount 0 must be at least 1"):
        f.place(req("a", 1, 0))


def test_adopt_records_an_earlier_allocation_and_refuses_a_conflict() -> None:
    f = fleet(2)
    original = fleet(2).place(req("a", 4))
    assert original.allocation is not None
    grants = original.allocation.grants
    assert f.adopt(req("a", 4), grants).granted
    assert f.holder("us0-n0") == "a"
    assert not f.adopt(req("b", 4), grants).granted


# --- properties -------------------------------------------------------------------------------

ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("place"),
            st.sampled_from((1, 2, 4)),
            st.integers(1, 3),
            st.sampled_from(list(Strategy)),
        ),
        st.tuples(st.just("release"), st.integers(0, 40)),
        st.tuples(st.just("health"), st.integers(0, 4 * 4 - 1), st.booleans()),
    ),
    max_size=60,
)


def _check_invariants(f: Fleet) -> None:
    seen: dict[str, str] = {}
    for allocation in f.allocations():
        assert len(allocation.nodes) == len(allocation.grants) * allocation.size
        for grant in allocation.grants:
            mask = sum(1 << i for i in grant.node_ids)
            assert (mask, grant.mode) in UNITS[allocation.size]
        for node in allocation.nodes:
            assert node not in seen, f"{node} in {seen.get(node)} and {allocation.uid}"
            seen[node] = allocation.uid
            assert f.holder(node) == allocation.uid


@settings(max_examples=300, deadline=None)
@given(ops)
def test_no_node_is_ever_in_two_allocations(history: list[tuple[Any, ...]]) -> None:
    f = fleet(4)
    placed: list[str] = []
    for n, op in enumerate(history):
        if op[0] == "place":
            _, size, count, strategy = op
            uid = f"w{n}"
            healthy_free_before = f.free_nodes()
            d = f.place(req(uid, size, count), strategy=strategy)
            if d.granted:
                assert d.allocation is not None
                placed.append(uid)
                assert f.free_nodes() == healthy_free_before - size * count
            else:
                assert f.free_nodes() == healthy_free_before
                assert f.allocation(uid) is None
                assert d.reason
        elif op[0] == "release" and placed:
            uid = placed.pop(int(op[1]) % len(placed))
            assert f.release(uid) is not None
        elif op[0] == "health":
            _, index, healthy = op
            f.set_health(f"us{int(index) // 4}-n{int(index) % 4}", healthy=bool(healthy))
        _check_invariants(f)


@settings(max_examples=200, deadline=None)
@given(ops, st.sampled_from((1, 2, 4)), st.integers(1, 3))
def test_release_returns_exactly_what_was_taken(
    history: list[tuple[Any, ...]], size: int, count: int
) -> None:
    f = fleet(4)
    for n, op in enumerate(history):
        if op[0] == "place":
            f.place(req(f"bg{n}", int(op[1]), int(op[2])))
    free_before = f.free_nodes()
    holders_before = {node: f.holder(node) for u in range(4) for node in _names(u)}
    d = f.place(req("probe", size, count))
    if not d.granted:
        return
    assert d.allocation is not None
    released = f.release("probe")
    assert released == d.allocation
    assert f.free_nodes() == free_before
    assert {node: f.holder(node) for u in range(4) for node in _names(u)} == holders_before


def _names(u: int) -> list[str]:
    return [f"us{u}-n{i}" for i in range(4)]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from((1, 2, 4)), st.integers(1, 2)), max_size=12))
def test_decisions_do_not_depend_on_the_order_nodes_were_learned(
    requests: list[tuple[int, int]],
) -> None:
    a, b = fleet(4), fleet(4, order=7)
    for n, (size, count) in enumerate(requests):
        assert a.place(req(f"w{n}", size, count)) == b.place(req(f"w{n}", size, count))
