"""UltraServer claims: only the bound workload's claims prepare, with the record's placement."""

from __future__ import annotations

from typing import Any

import pytest
from neuron_dra_common.ultraserver import (
    NODE_ALLOCATION,
    NodeAllocation,
    encode_node_allocation,
)
from neuron_dra_kubelet_plugin.claims import ClaimRef, ResourceClaim, claim_from_api
from neuron_dra_kubelet_plugin.edits import ultraserver_env
from neuron_dra_kubelet_plugin.plan import PrepareError
from neuron_dra_kubelet_plugin.ultraserver import UltraServerGate

NODE = "us0-trn2u-48xl-2"
REF = ClaimRef(namespace="ml", name="train-0-neurons", uid="c1")


def record(phase: str = "Bound", **kw: Any) -> NodeAllocation:
    fields: dict[str, Any] = {
        "workload": "ml/train",
        "workload_uid": "w1",
        "workload_id": "train",
        "phase": phase,
        "nodes": 4,
        "mode": 1,
        "server_id": "0cc11b23d945df1f",
        "node_id": 2,
        "topo_id": 6,
        "topo0_host": "us1-trn2u-48xl-0",
        "total_nodes": 8,
    }
    fields.update(kw)
    return NodeAllocation(**fields)


def claim(labels: dict[str, str] | None = None, mode: int = 4) -> ResourceClaim:
    return claim_from_api(
        {
            "metadata": {
                "name": REF.name,
                "namespace": REF.namespace,
                "uid": REF.uid,
                "labels": labels or {},
            },
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {
                                "request": "neurons",
                                "driver": "neuron.aws.com",
                                "pool": NODE,
                                "device": "neuronnode",
                            }
                        ],
                        "config": [
                            {
                                "source": "FromClaim",
                                "requests": ["neurons"],
                                "opaque": {
                                    "driver": "neuron.aws.com",
                                    "parameters": {
                                        "apiVersion": "neuron.aws.com/v1",
                                        "kind": "UltraServerConfig",
                                        "ultraserverMode": mode,
                                    },
                                },
                            }
                        ],
                    }
                }
            },
        }
    )


LABELS = {
    "neuron.amazonaws.com/ultraserver-server-id-4": "aaaa",
    "neuron.amazonaws.com/ultraserver-node-id-4": "2",
    "neuron.amazonaws.com/ultraserver-server-id-2": "bbbb",
    "neuron.amazonaws.com/ultraserver-node-id-2": "0",
}


class FakeApi:
    def __init__(
        self, annotations: dict[str, str], peers: list[dict[str, Any]] | None = None
    ) -> None:
        self.node = {"metadata": {"name": NODE, "labels": LABELS, "annotations": annotations}}
        self.peers = peers or []
        self.selectors: list[str] = []

    async def get(self, resource: Any, name: str, *, namespace: str | None = None) -> Any:
        return self.node

    async def list(
        self, resource: Any, *, namespace: str | None = None, label_selector: str = ""
    ) -> Any:
        self.selectors.append(label_selector)
        return self.peers, "1"


class Source:
    def __init__(self, c: ResourceClaim) -> None:
        self.claim = c

    async def get(self, ref: ClaimRef) -> ResourceClaim | None:
        return self.claim


WORKLOAD = {"neuron.aws.com/workload": "train", "neuron.aws.com/workload-uid": "w1"}


def annotated(r: NodeAllocation) -> dict[str, str]:
    return {NODE_ALLOCATION: encode_node_allocation(r)}


async def test_bound_workload_claim_gets_the_record_placement() -> None:
    gate = UltraServerGate(Source(claim(WORKLOAD)), api=FakeApi(annotated(record())), node=NODE)
    assert await gate.get(REF) is not None
    placement = gate.placement(REF)
    assert placement is not None
    env = ultraserver_env(placement, supported_modes=(1, 2, 3, 4))
    assert env == (
        "NEURON_RT_ULTRASERVER_MODE=1",
        "NEURON_RT_ULTRASERVER_SERVER_ID=0cc11b23d945df1f",
        "NEURON_RT_ULTRASERVER_NODE_ID=2",
        "NEURON_GLOBAL_TOPOID=6",
        "NEURON_GLOBAL_TOPOID0_HOST=us1-trn2u-48xl-0",
    )


async def test_recorded_mode_wins_over_the_preferred_one() -> None:
    r = record(nodes=2, mode=2, node_id=1, topo_id=1)
    gate = UltraServerGate(Source(claim(WORKLOAD, mode=2)), api=FakeApi(annotated(r)), node=NODE)
    await gate.get(REF)
    placement = gate.placement(REF)
    assert placement is not None
    assert (
        ultraserver_env(placement, supported_modes=(1, 2, 3, 4))[0]
        == "NEURON_RT_ULTRASERVER_MODE=2"
    )


async def test_claim_of_another_workload_is_refused_naming_both() -> None:
    other = {"neuron.aws.com/workload": "eval", "neuron.aws.com/workload-uid": "w2"}
    gate = UltraServerGate(Source(claim(other)), api=FakeApi(annotated(record())), node=NODE)
    with pytest.raises(
        PrepareError,
        match=r"NeuronUltraServerWorkload ml/eval.*bound to NeuronUltraServerWorkload ml/train \(workloadId train\)",
    ):
        await gate.get(REF)


async def test_plain_claim_on_a_bound_node_is_refused() -> None:
    gate = UltraServerGate(Source(claim()), api=FakeApi(annotated(record())), node=NODE)
    with pytest.raises(PrepareError, match=r"bound to NeuronUltraServerWorkload ml/train"):
        await gate.get(REF)


async def test_pending_allocation_says_what_is_missing() -> None:
    gate = UltraServerGate(
        Source(claim(WORKLOAD)), api=FakeApi(annotated(record("Pending"))), node=NODE
    )
    with pytest.raises(
        PrepareError,
        match=r"not complete: node us0-trn2u-48xl-2 is Pending; waiting until the operator binds all 8 nodes",
    ):
        await gate.get(REF)


async def test_workload_claim_on_an_unrecorded_node_waits() -> None:
    gate = UltraServerGate(Source(claim(WORKLOAD)), api=FakeApi({}), node=NODE)
    with pytest.raises(PrepareError, match=r"carries no allocation for it yet"):
        await gate.get(REF)


async def test_without_the_operator_placement_comes_from_the_node_labels() -> None:
    peer0 = {
        "metadata": {
            "name": "us0-trn2u-48xl-0",
            "labels": {**LABELS, "neuron.amazonaws.com/ultraserver-node-id-4": "0"},
        }
    }
    api = FakeApi({}, peers=[peer0])
    gate = UltraServerGate(Source(claim(mode=4)), api=api, node=NODE)
    await gate.get(REF)
    placement = gate.placement(REF)
    assert placement is not None
    assert (placement.nodes, placement.server_id, placement.node_id, placement.topo_id) == (
        4,
        "aaaa",
        2,
        2,
    )
    assert placement.topo0_host == "us0-trn2u-48xl-0"
    assert api.selectors == ["neuron.amazonaws.com/ultraserver-server-id-4=aaaa"]


class NoApi(FakeApi):
    async def get(self, resource: Any, name: str, *, namespace: str | None = None) -> Any:
        raise AssertionError("the Node was read")


async def test_a_node_outside_any_ultraserver_is_read_only_for_workload_claims() -> None:
    gate = UltraServerGate(
        Source(claim(mode=1)), api=NoApi({}), node=NODE, ultraserver_member=False
    )
    assert await gate.get(REF) is not None
    placement = gate.placement(REF)
    assert placement is not None
    assert (placement.nodes, placement.server_id, placement.topo0_host) == (1, "", NODE)
    gate = UltraServerGate(
        Source(claim(mode=4)), api=NoApi({}), node=NODE, ultraserver_member=False
    )
    await gate.get(REF)
    assert gate.placement(REF) is None
    gate = UltraServerGate(
        Source(claim(WORKLOAD)), api=FakeApi({}), node=NODE, ultraserver_member=False
    )
    with pytest.raises(PrepareError, match=r"carries no allocation for it yet"):
        await gate.get(REF)


async def test_a_claim_naming_the_bound_workload_without_its_uid_is_refused() -> None:
    labels = {"neuron.aws.com/workload": "train"}
    gate = UltraServerGate(Source(claim(labels)), api=FakeApi(annotated(record())), node=NODE)
    with pytest.raises(PrepareError) as refused:
        await gate.get(REF)
    assert str(refused.value) == (
        "ResourceClaim ml/train-0-neurons: label neuron.aws.com/workload-uid is missing; node "
        "us0-trn2u-48xl-2's devices are bound to NeuronUltraServerWorkload ml/train "
        "(workloadId train) with UID w1, and only claims that carry that UID are prepared there"
    )


async def test_a_claim_naming_the_bound_workload_with_another_uid_is_refused() -> None:
    # A workload deleted and made again under the same name, or a label written by hand.
    labels = {"neuron.aws.com/workload": "train", "neuron.aws.com/workload-uid": "w0"}
    gate = UltraServerGate(Source(claim(labels)), api=FakeApi(annotated(record())), node=NODE)
    with pytest.raises(PrepareError) as refused:
        await gate.get(REF)
    assert str(refused.value).startswith(
        "ResourceClaim ml/train-0-neurons: label neuron.aws.com/workload-uid is w0, not the UID "
        "w1 of NeuronUltraServerWorkload ml/train (workloadId train) that node "
        "us0-trn2u-48xl-2's devices are bound to"
    )
