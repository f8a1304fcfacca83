"""Valid connected sets and the scheduler extension's refusal."""

import pytest
from neuron_dra_common.topology import (
    InvalidDeviceCount,
    check_request,
    connected_sets,
    free_connected_sets,
    is_connected_set,
    valid_counts,
)

TORUS = ["trn1.32xlarge", "trn1n.32xlarge", "trn2.48xlarge", "trn2u.48xlarge"]


@pytest.mark.parametrize("name", TORUS)
def test_torus_offers_one_four_eight_sixteen(name: str) -> None:
    assert valid_counts(name) == (1, 4, 8, 16)
    assert connected_sets(name, 4) == (
        (0, 1, 2, 3),
        (4, 5, 6, 7),
        (8, 9, 10, 11),
        (12, 13, 14, 15),
    )
    assert connected_sets(name, 8) == (tuple(range(8)), tuple(range(8, 16)))
    assert connected_sets(name, 16) == (tuple(range(16)),)
    assert connected_sets(name, 1) == tuple((d,) for d in range(16))


def test_square_blocks_are_not_offered() -> None:
    assert not is_connected_set("trn2.48xlarge", [9, 10, 13, 14])
    assert is_connected_set("trn2.48xlarge", [7, 4, 6, 5])


def test_refusal_text_is_verbatim() -> None:
    with pytest.raises(InvalidDeviceCount) as err:
        check_request("trn1.32xlarge", 7)
    assert str(err.value) == (
        "Instance type trn1.32xlarge does not support requests for device: 7. "
        "Please request a different number of devices."
    )
    assert err.value.instance_type == "trn1.32xlarge"
    assert err.value.count == 7


@pytest.mark.parametrize(
    ("name", "count"),
    [("trn2.48xlarge", 2), ("trn2.48xlarge", 17), ("inf2.24xlarge", 7), ("inf2.xlarge", 0)],
)
def test_invalid_counts_are_refused(name: str, count: int) -> None:
    with pytest.raises(InvalidDeviceCount, match=f"Instance type {name} does not support"):
        check_request(name, count)
    assert connected_sets(name, count) == ()


@pytest.mark.parametrize(
    ("name", "count"), [("trn2.48xlarge", 8), ("inf2.48xlarge", 5), ("trn1.2xlarge", 1)]
)
def test_valid_counts_pass(name: str, count: int) -> None:
    check_request(name, count)


def test_ring_any_count_is_contiguous_and_wraps() -> None:
    assert valid_counts("inf2.48xlarge") == tuple(range(1, 13))
    pairs = connected_sets("inf2.48xlarge", 2)
    assert (0, 1) in pairs
    assert (0, 2) not in pairs
    # Device 11 links back to device 0, so the wrapping pair is offered.
    assert (0, 11) in pairs
    assert is_connected_set("inf2.48xlarge", [11, 0])
    assert len(pairs) == 12
    assert (0, 1, 10, 11) in connected_sets("inf2.48xlarge", 4)


def test_line_windows_do_not_wrap() -> None:
    assert connected_sets("inf2.24xlarge", 2) == ((0, 1), (1, 2), (2, 3), (3, 4), (4, 5))
    assert not is_connected_set("inf2.24xlarge", [5, 0])


def test_inf1_follows_the_extension_ring() -> None:
    assert is_connected_set("inf1.24xlarge", [15, 0, 1])
    assert not is_connected_set("inf1.24xlarge", [0, 2])


def test_all_to_all_every_subset_is_connected() -> None:
    assert is_connected_set("trn3.48xlarge", [0, 7, 13])
    assert valid_counts("trn3.48xlarge") == tuple(range(1, 17))


def test_free_connected_sets_only_uses_free_devices() -> None:
    free = [0, 1, 2, 3, 5, 6, 7, 8, 9, 10, 11]
    assert free_connected_sets("trn2.48xlarge", count=4, free=free) == (
        (0, 1, 2, 3),
        (8, 9, 10, 11),
    )
    assert free_connected_sets("trn2.48xlarge", count=8, free=free) == ()
    assert free_connected_sets("inf2.48xlarge", count=2, free=[11, 0, 5]) == ((0, 11),)
