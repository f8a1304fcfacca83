"""Planning a prepare: which claims are refused and why, and what the CDI spec holds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from neuron_dra_common import cdi
from neuron_dra_common.driver import NODE_DEVICE, device_index
from neuron_dra_kubelet_plugin.checkpoint import Checkpoint
from neuron_dra_kubelet_plugin.claims import ClaimRef
from neuron_dra_kubelet_plugin.edits import UltraServerPlacement
from neuron_dra_kubelet_plugin.plan import PrepareError, entry_from_spec, plan_prepare

from tests.unit.kubelet_plugin.support import make_claim, opaque, ref_of, trn2_node, trn2u_node

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


US_CTX = trn2u_node()


def _prepared(uid: str, devices: list[int | str], checkpoint: Checkpoint) -> Checkpoint:
    claim = make_claim(uid, devices, name=f"claim-{uid}")
    plan = plan_prepare(
        ref=ref_of(claim), claim=claim, node=US_CTX, checkpoint=checkpoint, boot_id="b1"
    )
    return checkpoint.with_entry(plan.entry)


def _refused_on_us(uid: str, devices: list[int | str], checkpoint: Checkpoint) -> str:
    claim = make_claim(uid, devices, name=f"claim-{uid}")
    with pytest.raises(PrepareError) as info:
        plan_prepare(
            ref=ref_of(claim), claim=claim, node=US_CTX, checkpoint=checkpoint, boot_id="b1"
        )
    return str(info.value)


def test_the_node_device_is_refused_while_a_chip_of_the_node_is_prepared() -> None:
    held = _prepared("u1", [3], Checkpoint())
    assert _refused_on_us("u2", [NODE_DEVICE], held) == (
        "ResourceClaim default/claim-u2: device neuronnode holds neurondevice3, which is "
        "already prepared for ResourceClaim default/claim-u1 (u1)"
    )


def test_a_chip_is_refused_while_the_node_device_is_prepared() -> None:
    held = _prepared("u1", [NODE_DEVICE], Checkpoint())
    assert _refused_on_us("u2", [3], held) == (
        "ResourceClaim default/claim-u2: device neurondevice3 is part of neuronnode, which "
        "is already prepared for ResourceClaim default/claim-u1 (u1)"
    )
    assert "device neuronnode is already prepared" in _refused_on_us("u3", [NODE_DEVICE], held)


# A claim: 1..3 devices of the UltraServer node's pool, the whole-node device among them.
_DEVICE_CHOICE = st.one_of(st.just(NODE_DEVICE), st.integers(0, 15))
_CLAIMS = st.lists(st.lists(_DEVICE_CHOICE, min_size=1, max_size=3, unique=True), max_size=12)


def _chips(device: int | str) -> set[int]:
    """What the test (not the plugin) knows a device name or index holds."""
    if device == NODE_DEVICE:
        return set(range(16))
    index = device if isinstance(device, int) else device_index(device)
    assert index is not None, device
    return {index}


@given(claims=_CLAIMS, releases=st.lists(st.integers(0, 11), max_size=4))
def test_no_neuron_device_is_ever_prepared_for_two_claims(
    claims: list[list[int | str]], releases: list[int]
) -> None:
    checkpoint = Checkpoint()
    for n, devices in enumerate(claims):
        uid = f"u{n}"
        if n in releases:
            # An unprepare in between frees what the claim before this one held.
            checkpoint = checkpoint.without(f"u{n - 1}")
        held = {
            chip for e in checkpoint.claims.values() for d in e.devices for chip in _chips(d.device)
        }
        wanted = set().union(*(_chips(d) for d in devices))
        if held & wanted:
            # Refused for a real overlap, naming the claim that holds it.
            with pytest.raises(PrepareError, match="already prepared for ResourceClaim default/"):
                _prepared(uid, devices, checkpoint)
        else:
            checkpoint = _prepared(uid, devices, checkpoint)
    per_chip: dict[int, set[str]] = {}
    for entry in checkpoint.claims.values():
        for d in entry.devices:
            for chip in _chips(d.device):
                per_chip.setdefault(chip, set()).add(entry.uid)
    assert all(len(holders) == 1 for holders in per_chip.values()), per_chip
