"""Planning a prepare: which claims are refused and why, and what the CDI spec holds."""

from __future__ import annotations

import pytest
from neuron_dra_common import cdi
from neuron_dra_kubelet_plugin.checkpoint import Checkpoint
from neuron_dra_kubelet_plugin.claims import ClaimRef
from neuron_dra_kubelet_plugin.edits import UltraServerPlacement
from neuron_dra_kubelet_plugin.plan import PrepareError, entry_from_spec, plan_prepare

from tests.unit.kubelet_plugin.support import make_claim, opaque, ref_of, trn2_node

NODE_CTX = trn2_node()


def env_of(spec: cdi.Spec) -> dict[str, str]:
    return dict(e.split("=", 1) for e in spec.container_edits.env)


def test_guide_1x4_connected_devices() -> None:
    claim = make_claim("u1", [2, 3, 1, 0])
    result = plan_prepare(
        ref=ref_of(claim), claim=claim, node=NODE_CTX, checkpoint=Checkpoint(), boot_id="b1"
    )
    assert env_of(result.spec) == {
        "NEURON_RT_VISIBLE_CORES": "0-15",
        "NEURON_LOGICAL_NC_CONFIG": "2",
    }
    nodes = [n.path for d in result.spec.devices for n in d.container_edits.device_nodes]
    assert sorted(nodes) == [f"/dev/neuron{i}" for i in range(4)]
    assert result.entry.devices[0].cdi_device_ids == ("neuron.aws.com/neuron=u1-neurondevice2",)
    assert all(d.request_names == ("neurons",) for d in result.entry.devices)


def test_all_neurons_lnc_1() -> None:
    config = [opaque("NeuronConfig", logicalNeuronCore=1, requests=["neurons"])]
    claim = make_claim("u1", list(range(16)), config=config)
    result = plan_prepare(
        ref=ref_of(claim), claim=claim, node=NODE_CTX, checkpoint=Checkpoint(), boot_id="b1"
    )
    assert env_of(result.spec) == {
        "NEURON_RT_VISIBLE_CORES": "0-127",
        "NEURON_LOGICAL_NC_CONFIG": "1",
    }


def test_subrequest_suffix_is_stripped() -> None:
    claim = make_claim("u1", [0], request="neurons/four")
    result = plan_prepare(
        ref=ref_of(claim), claim=claim, node=NODE_CTX, checkpoint=Checkpoint(), boot_id="b1"
    )
    assert result.entry.devices[0].request_names == ("neurons",)


def _refused(
    claim_uid: str,
    devices: list[int | str],
    *,
    ref: ClaimRef | None = None,
    checkpoint: Checkpoint | None = None,
    **kwargs: object,
) -> str:
    claim = make_claim(claim_uid, devices, **kwargs)
    with pytest.raises(PrepareError) as info:
        plan_prepare(
            ref=ref or ref_of(claim),
            claim=claim,
            node=NODE_CTX,
            checkpoint=checkpoint or Checkpoint(),
            boot_id="b1",
        )
    return str(info.value)


def test_bad_lnc_names_claim_and_field() -> None:
    message = _refused("u1", [0], config=[opaque("NeuronConfig", logicalNeuronCore=3)])
    assert message == (
        "ResourceClaim default/claim-u1: config[0].opaque.parameters.logicalNeuronCore: "
        "3 is not one of 1, 2"
    )


def test_unknown_kind_lists_the_known_ones() -> None:
    message = _refused("u1", [0], config=[opaque("GpuConfig")])
    assert "kind: 'GpuConfig' is not a kind of neuron.aws.com" in message
    assert "NeuronConfig, UltraServerConfig" in message


def test_other_node_pool_is_refused() -> None:
    assert "in pool other-node, not this node's pool" in _refused("u1", [0], pool="other-node")


def test_missing_device_is_refused() -> None:
    assert "device neurondevice16 does not exist" in _refused("u1", [16])
    assert "device gpu0 does not exist" in _refused("u1", ["gpu0"])


def test_recreated_claim_is_refused() -> None:
    ref = ClaimRef(namespace="default", name="claim-u1", uid="old-uid")
    assert "UID is u1, not old-uid" in _refused("u1", [0], ref=ref)


def test_unallocated_claim_is_refused() -> None:
    claim = make_claim("u1", [0])
    bare = type(claim)(metadata=claim.metadata)
    with pytest.raises(PrepareError, match="not allocated"):
        plan_prepare(
            ref=ref_of(claim), claim=bare, node=NODE_CTX, checkpoint=Checkpoint(), boot_id="b"
        )


def test_device_of_another_claim_is_refused() -> None:
    first = make_claim("u1", [0, 1], name="first")
    held = plan_prepare(
        ref=ref_of(first), claim=first, node=NODE_CTX, checkpoint=Checkpoint(), boot_id="b1"
    )
    message = _refused("u2", [1, 2], checkpoint=Checkpoint().with_entry(held.entry))
    assert message.endswith(
        "device neurondevice1 is already prepared for ResourceClaim default/first (u1)"
    )


def test_ultraserver_needs_a_placement_beyond_one_node() -> None:
    config = [opaque("UltraServerConfig", ultraserverMode=4)]
    assert "placement is not known yet" in _refused("u1", [0], config=config)


def test_ultraserver_single_node_and_placed() -> None:
    claim = make_claim("u1", [0], config=[opaque("UltraServerConfig", ultraserverMode=2)])
    placement = UltraServerPlacement(
        nodes=2, server_id="abc", node_id=1, topo_id=3, topo0_host="n0"
    )
    result = plan_prepare(
        ref=ref_of(claim),
        claim=claim,
        node=NODE_CTX,
        checkpoint=Checkpoint(),
        boot_id="b",
        placement=placement,
    )
    env = env_of(result.spec)
    assert env["NEURON_RT_ULTRASERVER_MODE"] == "3"
    assert env["NEURON_GLOBAL_TOPOID"] == "3"
    single = make_claim("u2", [0], config=[opaque("UltraServerConfig", ultraserverMode=1)])
    one = plan_prepare(
        ref=ref_of(single), claim=single, node=NODE_CTX, checkpoint=Checkpoint(), boot_id="b"
    )
    assert env_of(one.spec)["NEURON_RT_ULTRASERVER_MODE"] == "4"


def test_spec_rebuilds_the_entry() -> None:
    claim = make_claim("u1", [4, 5])
    result = plan_prepare(
        ref=ref_of(claim), claim=claim, node=NODE_CTX, checkpoint=Checkpoint(), boot_id="b1"
    )
    assert entry_from_spec(result.spec, boot_id="b1") == result.entry
