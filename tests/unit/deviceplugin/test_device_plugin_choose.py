"""GetPreferredAllocation's answers: connected sets on the topology engine, cores packed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from neuron_dra_common.topology import instance_spec, is_connected_set
from neuron_dra_device_plugin.choose import preferred_cores, preferred_devices

TRN2 = instance_spec("trn2.48xlarge")
INF2 = instance_spec("inf2.48xlarge")


def test_four_devices_on_an_empty_trn2_are_the_first_torus_row() -> None:
    assert preferred_devices(TRN2, available=range(16), must_include=(), size=4) == (0, 1, 2, 3)


def test_four_devices_on_trn2_skip_a_row_with_a_device_taken() -> None:
    free = [d for d in range(16) if d != 2]
    assert preferred_devices(TRN2, available=free, must_include=(), size=4) == (4, 5, 6, 7)


def test_eight_devices_on_trn2_are_two_aligned_rows() -> None:
    free = [d for d in range(16) if d not in (0, 1)]
    assert preferred_devices(TRN2, available=free, must_include=(), size=8) == tuple(range(8, 16))


def test_a_count_trn2_refuses_has_no_preference() -> None:
    assert preferred_devices(TRN2, available=range(16), must_include=(), size=7) == ()


def test_no_free_row_has_no_preference() -> None:
    free = [0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14]
    assert preferred_devices(TRN2, available=free, must_include=(), size=4) == ()


def test_three_devices_on_inf2_are_a_contiguous_window_at_the_edge_of_the_free_run() -> None:
    # Devices 0-1 and 9-11 are taken: the window starts where the free run starts, so the
    # longest window (5-8) stays free for the next request.
    free = range(2, 9)
    assert preferred_devices(INF2, available=free, must_include=(), size=3) == (2, 3, 4)


def test_an_inf2_window_wraps_from_device_11_to_device_0() -> None:
    assert preferred_devices(INF2, available=[11, 0, 5], must_include=(), size=2) == (0, 11)


def test_devices_the_container_must_keep_are_in_the_answer() -> None:
    assert preferred_devices(INF2, available=range(12), must_include=[6], size=2) == (5, 6)


@given(
    free=st.sets(st.integers(0, 11), min_size=1),
    size=st.integers(1, 12),
)
def test_an_inf2_preference_is_always_a_free_connected_window(free: set[int], size: int) -> None:
    chosen = preferred_devices(INF2, available=free, must_include=(), size=size)
    if chosen:
        assert len(chosen) == size
        assert set(chosen) <= free
        assert is_connected_set(INF2, chosen)


def test_nine_cores_on_an_empty_inf1_node_are_cores_0_to_8() -> None:
    # Seed 003: "Allocated ids for POD nrt-test-5038 are: 0,1,2,3,4,5,6,7,8".
    chosen = preferred_cores(available=range(16), must_include=(), size=9, cores_per_device=4)
    assert chosen == tuple(range(9))


def test_cores_go_to_the_device_they_fill_best() -> None:
    # Device 0 has 1 core free, device 1 has 3, device 2 all 4: two cores fit device 1.
    free = [3, 5, 6, 7, 8, 9, 10, 11]
    assert preferred_cores(available=free, must_include=(), size=2, cores_per_device=4) == (5, 6)


def test_cores_join_the_device_the_container_already_uses() -> None:
    chosen = preferred_cores(available=range(1, 16), must_include=[8], size=3, cores_per_device=4)
    assert chosen == (8, 9, 10)


def test_too_few_free_cores_has_no_preference() -> None:
    assert preferred_cores(available=[0, 1], must_include=(), size=3, cores_per_device=4) == ()


@given(free=st.sets(st.integers(0, 63)), size=st.integers(1, 64))
def test_cores_use_as_few_devices_as_the_count_needs_when_the_node_is_empty(
    free: set[int], size: int
) -> None:
    chosen = preferred_cores(available=range(64), must_include=(), size=size, cores_per_device=4)
    assert len(chosen) == size
    assert len({c // 4 for c in chosen}) == -(-size // 4)
    picked = preferred_cores(available=free, must_include=(), size=size, cores_per_device=4)
    assert picked == () if len(free) < size else set(picked) <= free


@pytest.mark.parametrize("size", [1, 16])
def test_one_or_all_devices_are_always_valid_on_trn2(size: int) -> None:
    assert len(preferred_devices(TRN2, available=range(16), must_include=(), size=size)) == size
