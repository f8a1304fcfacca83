"""The chaos checks that judge the fleet as a whole: every node offers all its devices, each
node holds a device at most once, the allocator's free UltraServers are the fleet minus the
held ones, and claims are allocated wherever they fit."""

from __future__ import annotations

from typing import Any

from neuron_dra_common.driver import DRIVER_NAME, NODE_DEVICE, device_name

from chaos.invariants import (
    allocator_mismatches,
    free_devices,
    held_on_node,
    offered_problems,
    unallocated_claims,
)

Obj = dict[str, Any]


def node(name: str, itype: str = "trn2.48xlarge") -> Obj:
    return {"metadata": {"name": name, "labels": {"node.kubernetes.io/instance-type": itype}}}


def piece(
    pool: str, *devices: str, generation: int = 1, count: int = 1, tainted: tuple[str, ...] = ()
) -> Obj:
    return {
        "spec": {
            "driver": DRIVER_NAME,
            "nodeName": pool,
            "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
            "devices": [
                {
                    "name": d,
                    **({"taints": [{"key": "k", "effect": "NoSchedule"}]} if d in tainted else {}),
                }
                for d in devices
            ],
        }
    }


ALL16 = tuple(device_name(i) for i in range(16))


def test_a_full_pool_per_node_is_fine_and_other_nodes_are_not_ours() -> None:
    nodes = [node("a"), node("u", "trn2u.48xlarge"), node("cpu", "m5.large")]
    slices = [piece("a", *ALL16), piece("u", count=2), piece("u", *ALL16, NODE_DEVICE, count=2)]
    assert offered_problems(nodes, slices) == []


def test_a_missing_pool_and_a_missing_device_are_named_with_their_node() -> None:
    nodes = [node("a"), node("b"), node("u", "trn2u.48xlarge")]
    slices = [piece("a", *ALL16[:15]), piece("u", *ALL16)]
    assert offered_problems(nodes, slices) == [
        "node a does not offer device neurondevice15",
        "node b offers no ResourceSlice pool (16 devices expected)",
        "node u does not offer device neuronnode",
    ]


def test_only_the_newest_generation_counts_and_it_must_be_complete() -> None:
    slices = [piece("a", *ALL16, generation=1), piece("a", *ALL16[:8], generation=2, count=2)]
    assert offered_problems([node("a")], slices) == [
        "node a's pool is incomplete: 1 of 2 slices of generation 2",
        *(f"node a does not offer device {d}" for d in ALL16[8:]),
    ]


def test_a_device_in_two_claims_of_a_checkpoint_or_two_cdi_specs_is_named() -> None:
    assert held_on_node("n1", {"u1": ["neurondevice3"], "u2": ["neurondevice4"]}, {}) == []
    checkpoint = {"u1": ["neurondevice3"], "u2": ["neurondevice3", "neurondevice4"]}
    specs = {"u1": ["/dev/neuron3"], "u2": ["/dev/neuron3"], "u3": ["/dev/neuron5"]}
    assert held_on_node("n1", checkpoint, specs) == [
        "node n1: checkpoint holds neurondevice3 in 2 claims (u1, u2)",
        "node n1: CDI specs hold /dev/neuron3 in 2 claims (u1, u2)",
    ]


FLEET = {"us-a": ["a0", "a1", "a2", "a3"], "us-b": ["b0", "b1", "b2", "b3"]}


def workload(name: str, *nodes: str) -> Obj:
    return {
        "metadata": {"name": name, "namespace": "chaos"},
        "status": {"allocations": [{"nodes": [{"nodeName": n} for n in nodes]}]},
    }


def refused(available: int) -> str:
    return f"needs 3 x 4-node units, {available} available (1 taken): ..."


def test_the_allocator_agreeing_with_the_workloads_is_fine() -> None:
    held = [workload("w", "a0", "a1")]
    taken = [("us-a", "taken", ["chaos/w"])]
    assert allocator_mismatches(FLEET, held, granted=False, reason=refused(1), refusals=taken) == []
    assert allocator_mismatches(FLEET, [], granted=False, reason=refused(2), refusals=[]) == []


def test_a_leaked_ultraserver_is_named_with_its_holder() -> None:
    ghost = [("us-b", "taken", ["ghosts/g"])]
    assert allocator_mismatches(FLEET, [], granted=False, reason=refused(1), refusals=ghost) == [
        "allocator has 1 whole UltraServers free, the fleet minus the held ones is 2 (held: none)",
        "allocator holds nodes of us-b for ghosts/g, which no NeuronUltraServerWorkload "
        "records there",
    ]


def test_more_free_than_the_workloads_leave_is_a_mismatch_too() -> None:
    held = [workload("w", "a0")]
    assert allocator_mismatches(FLEET, held, granted=False, reason=refused(2), refusals=[]) == [
        "allocator has 2 whole UltraServers free, the fleet minus the held ones is 1 (held: us-a)"
    ]
    assert allocator_mismatches(FLEET, [], granted=True, reason="", refusals=[]) == [
        "allocator granted 3 whole UltraServers of a fleet of 2"
    ]


def claim(name: str, *held: tuple[str, str]) -> Obj:
    results = [{"driver": DRIVER_NAME, "pool": p, "device": d} for p, d in held]
    return {
        "metadata": {"name": name, "namespace": "chaos"},
        "status": {"allocation": {"devices": {"results": results}}} if results else {},
    }


def pod(name: str, template: str, claim_name: str | None) -> Obj:
    statuses = [{"name": "c", "resourceClaimName": claim_name}] if claim_name else []
    return {
        "metadata": {"name": name},
        "spec": {"resourceClaims": [{"name": "c", "resourceClaimTemplateName": template}]},
        "status": {"resourceClaimStatuses": statuses},
    }


def test_free_devices_leave_out_held_tainted_and_whole_node_holds() -> None:
    slices = [piece("a", *ALL16, tainted=("neurondevice5",)), piece("u", *ALL16, NODE_DEVICE)]
    claims = [claim("x", ("a", "neurondevice0")), claim("y", ("u", NODE_DEVICE))]
    free = free_devices([node("a"), node("u"), node("gone")], slices, claims)
    assert free == {"a": set(range(16)) - {0, 5}, "u": set(), "gone": set()}


COUNTS = {"chaos-1": 1, "chaos-4": 4, "chaos-16": 16}


def test_an_unallocated_claim_that_fits_somewhere_is_named_with_where() -> None:
    claims = [claim("p1-c"), claim("p2-c")]
    pods = [pod("p1", "chaos-4", "p1-c"), pod("p2", "chaos-16", "p2-c")]
    free = {"a": set(range(16)) - {0, 5}}
    assert unallocated_claims(pods, claims, free, counts=COUNTS) == [
        "pod p1's claim p1-c (4 devices) is not allocated though node a has devices 8-11 free"
    ]


def test_a_workload_pod_must_have_its_claim_allocated_and_created() -> None:
    pods = [pod("w1-0", "w1", "w1-0-c"), pod("w1-1", "w1", None), pod("w2-0", "w2", "w2-0-c")]
    claims = [claim("w1-0-c"), claim("w2-0-c", ("u", NODE_DEVICE))]
    assert unallocated_claims(pods, claims, {}, counts=COUNTS) == [
        "pod w1-0's claim w1-0-c is not allocated",
        "pod w1-1 has no ResourceClaim for c yet",
    ]
