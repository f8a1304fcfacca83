"""Topology and device group attribute values, bit for bit with AWS's algorithm."""

import hashlib

import pytest
from neuron_dra_common.topology import (
    attribute_groups,
    device_attributes,
    group_attribute_names,
    node_attributes,
)


def _h(joined: str) -> str:
    return hashlib.sha256(joined.encode()).hexdigest()[:16]


# The group members' EFA addresses, de-duplicated, sorted and joined, written out by hand
# from the trn2 EFA map; the pinned digests were computed with sha256sum.
ROW0 = "0000:b3:00.0,0000:b4:00.0,0000:c9:00.0,0000:ca:00.0"
ROW1 = "0000:56:00.0,0000:57:00.0,0000:6c:00.0,0000:6d:00.0"
ROW2 = "0000:82:00.0,0000:83:00.0,0000:98:00.0,0000:99:00.0"
ROW3 = "0000:df:00.0,0000:e0:00.0,0000:f5:00.0,0000:f6:00.0"
HALF0 = f"{ROW1},{ROW0}"
HALF1 = f"{ROW2},{ROW3}"
ALL = f"{ROW1},{ROW2},{ROW0},{ROW3}"

PINNED = {
    ROW0: "13713e551cd37c19",
    ROW1: "671622785349fddf",
    ROW2: "237e3ef7b968b4d3",
    ROW3: "b3d6ce1919d29f8f",
    HALF0: "3593812b8066a078",
    HALF1: "614e16dab9ba2f1f",
    ALL: "821d14afaf11327d",
}


def test_hand_written_member_lists_hash_to_the_pinned_digests() -> None:
    for joined, digest in PINNED.items():
        assert _h(joined) == digest


@pytest.mark.parametrize("name", ["trn2.48xlarge", "trn2u.48xlarge"])
def test_trn2_devicegroup_ids(name: str) -> None:
    attrs = node_attributes(name)
    rows = [ROW0, ROW1, ROW2, ROW3]
    for device in range(16):
        a = attrs[device]
        assert a["resource.aws.com/devicegroup4_id"] == PINNED[rows[device // 4]]
        assert a["resource.aws.com/devicegroup8_id"] == PINNED[HALF0 if device < 8 else HALF1]
        assert a["resource.aws.com/devicegroup16_id"] == PINNED[ALL]


@pytest.mark.parametrize(
    ("device", "efa"),
    [(0, "0000:c9:00.0"), (5, "0000:57:00.0"), (10, "0000:82:00.0"), (15, "0000:f6:00.0")],
)
def test_trn2_devicegroup1_is_the_efa_address(device: int, efa: str) -> None:
    assert device_attributes("trn2.48xlarge", device)["resource.aws.com/devicegroup1_id"] == efa


def test_trn2_torus_coordinates_and_rows() -> None:
    a = device_attributes("trn2.48xlarge", 9)
    assert a["topology_x"] == 2
    assert a["topology_y"] == 1
    assert a["topology4_id"] == 2
    assert a["topology8_id"] == 1


@pytest.mark.parametrize(
    "name", ["trn1.32xlarge", "trn1n.32xlarge", "inf2.48xlarge", "trn3.48xlarge", "inf1.24xlarge"]
)
def test_no_efa_map_means_no_devicegroup_attributes(name: str) -> None:
    for attrs in node_attributes(name):
        assert not [k for k in attrs if k.startswith("resource.aws.com/")]


def test_trn1_still_publishes_torus_rows() -> None:
    assert attribute_groups("trn1.32xlarge", "topology4_id")[3] == (12, 13, 14, 15)
    assert set(device_attributes("trn1.32xlarge", 6)) == {
        "topology_x",
        "topology_y",
        "topology4_id",
        "topology8_id",
    }


def test_inf2_ring_publishes_aligned_groups() -> None:
    assert group_attribute_names("inf2.48xlarge") == (
        "topology2_id",
        "topology4_id",
        "topology8_id",
    )
    assert attribute_groups("inf2.48xlarge", "topology2_id")[5] == (10, 11)
    assert attribute_groups("inf2.48xlarge", "topology4_id")[2] == (8, 9, 10, 11)
    # The last pair-of-fours group is short: the ring has 12 devices.
    assert attribute_groups("inf2.48xlarge", "topology8_id") == {
        0: tuple(range(8)),
        1: (8, 9, 10, 11),
    }


def test_inf2_line_publishes_only_groups_it_can_fill() -> None:
    assert group_attribute_names("inf2.24xlarge") == ("topology2_id", "topology4_id")
    assert attribute_groups("inf2.24xlarge", "topology4_id") == {0: (0, 1, 2, 3), 1: (4, 5)}


@pytest.mark.parametrize("name", ["inf1.xlarge", "inf2.xlarge", "trn1.2xlarge"])
def test_single_device_instances_publish_no_topology(name: str) -> None:
    assert node_attributes(name) == ({},)
    assert group_attribute_names(name) == ()


def test_device_outside_the_node_names_the_instance() -> None:
    with pytest.raises(ValueError, match=r"instance type trn2\.48xlarge has no device 16"):
        device_attributes("trn2.48xlarge", 16)
