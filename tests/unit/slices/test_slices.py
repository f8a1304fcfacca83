"""The pool a node publishes: devices, attributes, capacity, the node device, limits."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from neuron_dra_common.driver import NODE_DEVICE
from neuron_dra_common.hardware.model import NeuronDevice, NodeHardware
from neuron_dra_slice_publisher.slices import (
    COUNTER_SET,
    InventoryError,
    NodeDeviceMode,
    PoolContent,
    build_pool,
)

from tests.unit.slices.support import US_LABELS, hardware

COUNTERS = NodeDeviceMode.COUNTERS


def pool(
    instance_type: str,
    *,
    mode: NodeDeviceMode = COUNTERS,
    labels: dict[str, str] | None = None,
    **kw: Any,
) -> PoolContent:
    hw = hardware(instance_type, **kw)
    return build_pool(
        node="node-a", hardware=hw, labels=labels or {}, mode=mode, dra_driver_version="0.1.0"
    )


def devices(content: PoolContent) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in content.slices for d in s.devices}


def attrs(device: dict[str, Any]) -> dict[str, object]:
    raw = device["attributes"]
    assert isinstance(raw, dict)
    return {k: next(iter(v.values())) for k, v in raw.items()}


def test_trn2_publishes_sixteen_chips_in_one_slice_with_aws_attributes() -> None:
    content = pool("trn2.48xlarge")
    assert len(content.slices) == 1
    assert content.device_names == tuple(f"neurondevice{i}" for i in range(16))
    five = attrs(devices(content)["neurondevice5"])
    assert five["deviceId"] == 5
    assert five["instanceType"] == "trn2.48xlarge"
    assert five["neuronDriverVersion"] == "2.24.7.0"
    assert five["draDriverVersion"] == "0.1.0"
    assert five["resourceType"] == "neuron_device"
    assert (five["topology_x"], five["topology_y"]) == (1, 1)
    assert (five["topology4_id"], five["topology8_id"]) == (1, 0)
    assert five["resource.aws.com/devicegroup1_id"] == "0000:57:00.0"
    assert "ultraserverId" not in five
    capacity = devices(content)["neurondevice5"]["capacity"]
    assert capacity == {"memory": {"value": "103079215104"}, "neuronCores": {"value": "4"}}
    assert NODE_DEVICE not in devices(content)


def test_devicegroup4_values_are_one_per_torus_row() -> None:
    content = pool("trn2.48xlarge")
    rows: dict[object, set[int]] = {}
    for device in devices(content).values():
        a = attrs(device)
        rows.setdefault(a["resource.aws.com/devicegroup4_id"], set()).add(int(a["deviceId"]))  # type: ignore[call-overload]
    assert sorted(map(sorted, rows.values())) == [list(range(r * 4, r * 4 + 4)) for r in range(4)]


def test_ultraserver_node_gets_a_node_device_exclusive_through_counters() -> None:
    content = pool("trn2u.48xlarge", labels=US_LABELS, ultraserver_node=2)
    counters, device_slice = content.slices
    assert len(device_slice.devices) == 17
    assert counters.devices == ()
    [counter_set] = counters.shared_counters
    assert counter_set["name"] == COUNTER_SET
    assert sorted(counter_set["counters"]) == sorted(f"neurondevice{i}" for i in range(16))
    by_name = devices(content)
    assert list(by_name)[-1] == NODE_DEVICE, "the node device comes after every chip"
    node = by_name[NODE_DEVICE]
    [consumption] = node["consumesCounters"]
    assert set(consumption["counters"]) == set(counter_set["counters"])
    for i in range(16):
        [mine] = by_name[f"neurondevice{i}"]["consumesCounters"]
        assert mine["counters"] == {f"neurondevice{i}": {"value": "1"}}
    a = attrs(node)
    assert a["resourceType"] == "neuron_node"
    assert a["nodeInstanceType"] == "trn2u.48xlarge"
    assert a["ultraserverNodeId"] == 2
    assert a["capacityBlockId"] == "cr-0123456789abcdef0"
    assert a["networkNodeLayer3"] == "nn-3333"
    assert node["capacity"]["memory"]["value"] == str(16 * 103079215104)
    chip = attrs(by_name["neurondevice0"])
    assert chip["ultraserverId"] == a["ultraserverId"]
    assert len(str(a["ultraserverId"])) == 16


def test_a_guide_chip_selector_never_matches_the_node_device() -> None:
    """The guide's CEL reads instanceType (and neuronDriverVersion): every device has both, and
    the node device's instanceType is no instance type at all."""
    content = pool("trn2u.48xlarge", labels=US_LABELS, ultraserver_node=0)
    for device in devices(content).values():
        a = attrs(device)
        assert {"instanceType", "neuronDriverVersion", "resourceType"} <= set(a)
        is_node = a["resourceType"] == "neuron_node"
        for chip_type in ("trn2u.48xlarge", "trn2.48xlarge"):
            assert (a["instanceType"] == chip_type) is (
                not is_node and chip_type == "trn2u.48xlarge"
            )


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        (NodeDeviceMode.NODE_ONLY, (NODE_DEVICE,)),
        (NodeDeviceMode.CHIPS_ONLY, tuple(f"neurondevice{i}" for i in range(16))),
    ],
)
def test_without_counters_a_node_publishes_one_kind_only(
    mode: NodeDeviceMode, expected: tuple[str, ...]
) -> None:
    """The floor (no partitionable devices): chips and node device are never both offered,
    so no two claims can hold overlapping hardware."""
    content = pool("trn2u.48xlarge", mode=mode, labels=US_LABELS, ultraserver_node=1)
    assert content.device_names == expected
    assert all(not s.shared_counters for s in content.slices)
    assert all("consumesCounters" not in d for d in devices(content).values())


def test_node_only_mode_leaves_plain_nodes_with_their_chips() -> None:
    content = pool("trn2.48xlarge", mode=NodeDeviceMode.NODE_ONLY)
    assert len(content.device_names) == 16


def test_inf2_publishes_aligned_groups_and_no_devicegroups() -> None:
    content = pool("inf2.48xlarge")
    eleven = attrs(devices(content)["neurondevice11"])
    assert (eleven["topology2_id"], eleven["topology4_id"], eleven["topology8_id"]) == (5, 2, 1)
    assert not any(k.startswith("resource.aws.com/") for k in eleven)
    assert devices(content)["neurondevice0"]["capacity"]["neuronCores"] == {"value": "2"}


def test_every_device_stays_within_the_api_limits() -> None:
    cases: tuple[tuple[str, dict[str, Any]], ...] = (
        ("trn2u.48xlarge", {"ultraserver_node": 3}),
        ("trn2.48xlarge", {}),
        ("trn1.32xlarge", {}),
        ("inf1.24xlarge", {}),
        ("trn3.48xlarge", {"ultraserver_node": 0}),
    )
    for itype, kw in cases:
        content = pool(itype, labels=US_LABELS, **kw)
        for s in content.slices:
            assert not (s.devices and s.shared_counters)
            limit = 64 if any("consumesCounters" in d for d in s.devices) else 128
            assert len(s.devices) <= limit
        for device in devices(content).values():
            assert len(device["attributes"]) + len(device["capacity"]) <= 32, itype
            for name in device["attributes"]:
                assert len(name.split("/")[-1]) <= 32


def test_overlong_label_values_are_left_out_and_reported() -> None:
    labels = {"topology.k8s.aws/capacity-block-id": "x" * 80}
    content = pool("trn2.48xlarge", labels=labels)
    assert "capacityBlockId" not in attrs(devices(content)["neurondevice0"])
    assert any("capacityBlockId" in s for s in content.skipped)


def test_a_device_that_could_not_be_read_is_not_published() -> None:
    hw = hardware("trn2.48xlarge")
    partial = msgspec.structs.replace(hw, devices=tuple(d for d in hw.devices if d.index != 7))
    content = build_pool(
        node="n", hardware=partial, labels={}, mode=COUNTERS, dra_driver_version="0.1.0"
    )
    assert "neurondevice7" not in content.device_names
    assert len(content.device_names) == 15


def test_unknown_instance_type_is_refused_naming_node_and_field() -> None:
    hw = NodeHardware(instance_type="m5.large", devices=(NeuronDevice(index=0),))
    with pytest.raises(InventoryError, match=r"NodeInventory n1: hardware.instance_type"):
        build_pool(node="n1", hardware=hw, labels={}, mode=COUNTERS, dra_driver_version="0.1.0")


def test_same_inputs_give_the_same_content() -> None:
    assert pool("trn2.48xlarge") == pool("trn2.48xlarge")


def test_devices_carry_the_instance_type_the_node_reports() -> None:
    # AWS's UltraServer guide names Trn3 UltraServer nodes "Trn3pds"; the catalog's own name
    # (trn3.48xlarge) would not match a selector written with the node's label value.
    content = pool("Trn3pds.48xlarge", labels=US_LABELS, ultraserver_node=0)
    chip = attrs(devices(content)["neurondevice0"])
    assert chip["instanceType"] == "trn3pds.48xlarge"
    assert chip["nodeInstanceType"] == "trn3pds.48xlarge"
    assert devices(content)["neurondevice0"]["capacity"]["memory"] == {"value": str(144 * 1024**3)}
