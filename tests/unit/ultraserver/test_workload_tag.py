"""The slice publisher tags every device of an allocated node with the workloadId."""

from __future__ import annotations

from neuron_dra_common.hardware.model import NeuronDevice, NodeHardware, UltraServerInfo
from neuron_dra_common.ultraserver import NODE_ALLOCATION, NodeAllocation, encode_node_allocation
from neuron_dra_slice_publisher.controller import NodeInfo
from neuron_dra_slice_publisher.slices import NodeDeviceMode, build_pool

HW = NodeHardware(
    instance_type="trn2u.48xlarge",
    driver_version="2.24.7.0",
    devices=tuple(NeuronDevice(index=i) for i in range(16)),
    ultraserver=UltraServerInfo(
        server_id_4="0a1b2c3d4e5f6071", node_id_4=1, supported_modes=(1, 2, 3, 4)
    ),
)


def test_every_device_carries_the_workload_id_and_only_when_allocated() -> None:
    tagged = build_pool(
        node="n1",
        hardware=HW,
        labels={},
        mode=NodeDeviceMode.COUNTERS,
        dra_driver_version="0.1.0",
        workload_id="my-training-job",
    )
    devices = [d for s in tagged.slices for d in s.devices]
    assert len(devices) == 17
    assert all(d["attributes"]["workloadId"] == {"string": "my-training-job"} for d in devices)
    plain = build_pool(
        node="n1", hardware=HW, labels={}, mode=NodeDeviceMode.COUNTERS, dra_driver_version="0.1.0"
    )
    assert all("workloadId" not in d["attributes"] for s in plain.slices for d in s.devices)


def test_the_node_record_names_the_workload() -> None:
    record = NodeAllocation(
        workload="default/my-training-job",
        workload_uid="u",
        workload_id="my-training-job",
        phase="Bound",
        nodes=4,
        mode=1,
        server_id="s",
        node_id=1,
        topo_id=1,
        topo0_host="n0",
    )
    obj = {
        "metadata": {"name": "n1", "annotations": {NODE_ALLOCATION: encode_node_allocation(record)}}
    }
    assert NodeInfo.from_object(obj).workload_id == "my-training-job"
    assert NodeInfo.from_object({"metadata": {"name": "n1"}}).workload_id == ""
