"""What every consumer refuses before its handler runs, and the reason it gives."""

from __future__ import annotations

import pytest
from neuron_dra_common.bus import IntakeLimits, Refused, admit, limits_of
from neuron_dra_common.events import (
    AllocationReleased,
    AllocationRequested,
    DeviceHealthChanged,
    NodeInventory,
    ObjectRef,
    encode,
    subject_token,
)
from neuron_dra_common.hardware.model import NeuronDevice, NodeHardware
from neuron_dra_common.settings import ServiceSettings, load

from tests.contracts.support import heartbeat

LIMITS = IntakeLimits()


def inventory(node: str, devices: int) -> NodeInventory:
    return NodeInventory(
        node=node,
        boot_id="boot",
        generation=1,
        hardware=NodeHardware(
            instance_type="trn2.48xlarge",
            driver_version="2.24.7.0",
            devices=tuple(NeuronDevice(index=i) for i in range(devices)),
        ),
    )


def refusal(payload: bytes, subject: str, **kw: object) -> Refused:
    with pytest.raises(Refused) as caught:
        admit(payload, subject=subject, **kw)  # type: ignore[arg-type]
    return caught.value


def test_an_event_on_its_own_subject_is_admitted() -> None:
    event = heartbeat("ip-10-0-0-1.ec2.internal")
    assert admit(encode(event), subject=event.subject, limits=LIMITS) == event


def test_bytes_that_are_not_an_event_are_a_decode_refusal() -> None:
    refused = refusal(b"\xff\xfe", "neuron.heartbeat.a", limits=LIMITS)
    assert refused.kind == "decode"
    assert "not JSON" in str(refused)


def test_an_unknown_type_names_the_tag() -> None:
    refused = refusal(b'{"type":"no.such.v1"}', "neuron.heartbeat.a", limits=LIMITS)
    assert (refused.kind, "no.such.v1" in str(refused)) == ("decode", True)


def test_a_valid_event_of_the_wrong_type_for_the_subject_is_refused() -> None:
    event = heartbeat("node-a")
    refused = refusal(encode(event), "neuron.inventory.node-a", limits=LIMITS)
    assert refused.kind == "refused"
    assert str(refused) == (
        "node.heartbeat.v1 on neuron.inventory.node-a: its body belongs on neuron.heartbeat.node-a"
    )


def test_a_body_about_another_node_than_its_subject_is_refused() -> None:
    event = DeviceHealthChanged(node="node-b", device="neurondevice3", health="Unhealthy")
    refused = refusal(encode(event), "neuron.health.node-a.neurondevice3", limits=LIMITS)
    assert "belongs on neuron.health.node-b.neurondevice3" in str(refused)


def test_an_event_without_a_node_name_is_not_decoded() -> None:
    refused = refusal(encode(heartbeat("")), "neuron.heartbeat.x", limits=LIMITS)
    assert refused.kind == "decode"
    assert str(refused).startswith("event payload: `$.node` '' is not a node name")


@pytest.mark.parametrize("name", ["a_b", "A.b", "a..b", "-a", "a.b-", "x" * 254, "a b"])
def test_a_node_name_that_is_no_dns_subdomain_is_not_decoded(name: str) -> None:
    """``a_b`` and ``a.b`` would both become the subject token ``a_b``: only the second is a
    node name, so one node can never publish on another's subject."""
    subject = f"neuron.heartbeat.{subject_token(name)}"
    refused = refusal(encode(heartbeat(name)), subject, limits=LIMITS)
    assert refused.kind == "decode"
    assert "`$.node`" in str(refused)
    assert "is not a node name (a DNS-1123 subdomain" in str(refused)
    assert admit(encode(heartbeat("a.b")), subject="neuron.heartbeat.a_b", limits=LIMITS)


def test_every_node_name_of_an_allocation_is_checked() -> None:
    ref = ObjectRef(namespace="ns", name="w")
    event = AllocationReleased(request_id="r", workload=ref, nodes=("n-1", "N_2"))
    refused = refusal(encode(event), event.subject, limits=LIMITS, accepts=(AllocationReleased,))
    assert refused.kind == "decode"
    assert "`$.nodes[1]` 'N_2' is not a node name" in str(refused)


def test_a_nodes_event_on_another_nodes_subject_names_the_node() -> None:
    refused = refusal(encode(heartbeat("node-b")), "neuron.heartbeat.node-a", limits=LIMITS)
    assert refused.kind == "refused"
    assert str(refused) == (
        "node.heartbeat.v1 on neuron.heartbeat.node-a: its body belongs on "
        "neuron.heartbeat.node-b (its body is about node node-b)"
    )


def test_a_message_over_the_size_limit_is_refused_before_it_is_parsed() -> None:
    limits = IntakeLimits(max_message_bytes=1024)
    refused = refusal(b"x" * 1025, "neuron.heartbeat.a", limits=limits)
    assert refused.kind == "refused"
    assert str(refused) == (
        "message on neuron.heartbeat.a: 1025 bytes is over the limit of 1024 bytes"
    )
    assert admit(encode(heartbeat("a")), subject="neuron.heartbeat.a", limits=limits)


def test_an_inventory_over_the_device_limit_is_refused() -> None:
    at_limit, over = inventory("node-a", 64), inventory("node-a", 65)
    assert admit(encode(at_limit), subject=at_limit.subject, limits=LIMITS) == at_limit
    refused = refusal(encode(over), over.subject, limits=LIMITS)
    assert str(refused) == (
        "NodeInventory node-a: hardware.devices has 65 devices, over the limit of 64"
    )


def test_a_request_subject_admits_only_the_types_it_answers() -> None:
    request = AllocationRequested(
        request_id="r1",
        workload=ObjectRef(namespace="default", name="train", uid="u1"),
        topology_size=4,
        server_count=1,
    )
    accepts = (AllocationRequested,)
    assert admit(encode(request), subject="neuron.rpc.allocator", limits=LIMITS, accepts=accepts)
    refused = refusal(
        encode(heartbeat("a")), "neuron.rpc.allocator", limits=LIMITS, accepts=accepts
    )
    assert str(refused) == (
        "message on neuron.rpc.allocator: node.heartbeat.v1 is not one of allocation.requested.v1"
    )


def test_the_limits_are_settings_with_environment_twins() -> None:
    settings = load(
        ServiceSettings,
        argv=[],
        environ={
            "NEURON_DRA_BUS_MAX_MESSAGE_BYTES": "65536",
            "NEURON_DRA_BUS_MAX_INVENTORY_DEVICES": "32",
        },
    )
    assert limits_of(settings) == IntakeLimits(max_message_bytes=65536, max_inventory_devices=32)
    assert limits_of(load(ServiceSettings, argv=[], environ={})) == IntakeLimits(
        max_message_bytes=1 << 20, max_inventory_devices=64
    )


def test_a_limit_below_what_any_event_needs_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="NEURON_DRA_BUS_MAX_MESSAGE_BYTES"):
        load(ServiceSettings, argv=[], environ={"NEURON_DRA_BUS_MAX_MESSAGE_BYTES": "10"})
