"""Neighbour lists per link topology, in the driver's order for the torus."""

import pytest
from neuron_dra_common.topology import LinkTopology, adjacency, instance_spec, neighbours


@pytest.mark.parametrize(
    ("device", "expected"),
    [
        (0, (12, 3, 4, 1)),
        (5, (1, 4, 9, 6)),
        (15, (11, 14, 3, 12)),
        (10, (6, 9, 14, 11)),
    ],
)
def test_torus_lists_up_left_down_right_with_wrap(device: int, expected: tuple[int, ...]) -> None:
    assert neighbours(LinkTopology.TORUS4X4, devices=16, device=device) == expected


def test_ring_links_the_last_device_back_to_the_first() -> None:
    table = adjacency(instance_spec("inf2.48xlarge"))
    assert table[0] == (11, 1)
    assert table[11] == (10, 0)


def test_line_has_no_wrap() -> None:
    table = adjacency(instance_spec("inf2.24xlarge"))
    assert table == ((1,), (0, 2), (1, 3), (2, 4), (3, 5), (4,))


def test_all_to_all_reaches_every_other_device() -> None:
    table = adjacency(instance_spec("trn3.48xlarge"))
    assert table[3] == tuple(d for d in range(16) if d != 3)


def test_single_device_has_no_links() -> None:
    assert adjacency(instance_spec("trn1.2xlarge")) == ((),)


def test_device_outside_the_node_is_refused() -> None:
    with pytest.raises(ValueError, match=r"device 16 is outside 0\.\.15"):
        neighbours(LinkTopology.TORUS4X4, devices=16, device=16)


def test_torus_needs_sixteen_devices() -> None:
    with pytest.raises(ValueError, match="a 4x4 torus has 16 devices, not 8"):
        neighbours(LinkTopology.TORUS4X4, devices=8, device=0)
