"""Rendered slices as Kubernetes protobuf bodies: every field there, nothing dropped."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from google.protobuf import json_format
from neuron_dra_common.hardware.model import NeuronDevice, NodeHardware
from neuron_dra_protos.kube.resource.v1 import resourceslice_pb2 as pb
from neuron_dra_slice_publisher.encoding import MAGIC, Unencodable, encode_slice
from neuron_dra_slice_publisher.pool import NodeRef, render_slice
from neuron_dra_slice_publisher.slices import NodeDeviceMode, build_pool


def ultraserver_bodies() -> list[dict[str, Any]]:
    hardware = NodeHardware(
        instance_type="trn2u.48xlarge",
        driver_version="2.24.7.0",
        devices=tuple(NeuronDevice(index=i) for i in range(16)),
    )
    content = build_pool(
        node="us0-n1",
        hardware=hardware,
        labels={"neuron.amazonaws.com/ultraserver-server-id-4": "us-1"},
        mode=NodeDeviceMode.COUNTERS,
        dra_driver_version="0.1.0",
    )
    owner = NodeRef(name="us0-n1", uid="2b7c6f0e-uid")
    count = len(content.slices)
    bodies = [
        render_slice(part, owner=owner, index=i, generation=7, count=count)
        for i, part in enumerate(content.slices)
    ]
    bodies[-1]["spec"]["devices"][0]["attributes"] |= {
        "healthy": {"bool": False},
        "firmwareVersion": {"version": "1.2.3"},
        "offset": {"int": -1},
    }
    bodies[-1]["metadata"]["resourceVersion"] = "12345"
    return bodies


def decode(data: bytes) -> tuple[pb.Unknown, pb.ResourceSlice]:
    assert data[:4] == MAGIC
    envelope = pb.Unknown.FromString(data[4:])
    return envelope, pb.ResourceSlice.FromString(envelope.raw)


def _unwrap(values: dict[str, Any]) -> dict[str, Any]:
    return {k: {"value": v["value"]["string"]} for k, v in values.items()}


def as_json(message: pb.ResourceSlice) -> dict[str, Any]:
    """The decoded message back in the API's JSON shape (quantities as strings)."""
    out = json_format.MessageToDict(message, preserving_proto_field_name=True)
    spec = out["spec"]
    for device in spec.get("devices", ()):
        device["capacity"] = _unwrap(device["capacity"])
        for use in device.get("consumesCounters", ()):
            use["counters"] = _unwrap(use["counters"])
        for value in device["attributes"].values():
            if "int" in value:  # JSON mapping writes int64 as a string
                value["int"] = int(value["int"])
    for counter_set in spec.get("sharedCounters", ()):
        counter_set["counters"] = _unwrap(counter_set["counters"])
    for key in ("generation", "resourceSliceCount"):
        spec["pool"][key] = int(spec["pool"][key])
    return out


@pytest.mark.parametrize("index", [0, 1])
def test_every_rendered_field_survives_the_round_trip(index: int) -> None:
    body = ultraserver_bodies()[index]
    envelope, message = decode(encode_slice(body))
    assert (envelope.typeMeta.apiVersion, envelope.typeMeta.kind) == (
        "resource.k8s.io/v1",
        "ResourceSlice",
    )
    want = copy.deepcopy(body)
    del want["apiVersion"], want["kind"]
    assert as_json(message) == want


def test_zero_values_are_written_not_left_out() -> None:
    body = ultraserver_bodies()[-1]
    _, message = decode(encode_slice(body))
    chip = message.spec.devices[0]
    assert chip.attributes["deviceId"].HasField("int")
    assert chip.attributes["deviceId"].int == 0
    assert chip.attributes["healthy"].HasField("bool")
    assert not chip.attributes["healthy"].bool
    node_device = message.spec.devices[-1]
    assert node_device.name == "neuronnode"
    assert node_device.attributes["instanceType"].HasField("string")
    assert node_device.attributes["instanceType"].string == ""


@pytest.mark.parametrize(
    "change",
    [
        lambda b: b.__setitem__("status", {}),
        lambda b: b["spec"]["devices"][0].__setitem__("bindsToNode", True),
        lambda b: b["spec"]["devices"][0].__setitem__("taints", [{"timeAdded": "now"}]),
        lambda b: b["metadata"].__setitem__("finalizers", ["x"]),
        lambda b: b["spec"]["devices"][0]["capacity"]["memory"].__setitem__("requestPolicy", {}),
        lambda b: b["spec"]["devices"][0]["attributes"].__setitem__("x", {"int": "seven"}),
        lambda b: b["spec"]["devices"][0]["attributes"].__setitem__("x", {"float": 1.5}),
    ],
)
def test_what_the_messages_do_not_declare_is_refused(change: Any) -> None:
    body = ultraserver_bodies()[-1]
    change(body)
    with pytest.raises(Unencodable):
        encode_slice(body)


def test_device_taints_survive_the_round_trip() -> None:
    body = ultraserver_bodies()[-1]
    taint = {"key": "neuron.aws.com/hardware-error", "value": "DMA_ERROR", "effect": "NoExecute"}
    body["spec"]["devices"][3]["taints"] = [taint]
    _, message = decode(encode_slice(body))
    assert as_json(message)["spec"]["devices"][3]["taints"] == [taint]
    assert "taints" not in as_json(message)["spec"]["devices"][2]
