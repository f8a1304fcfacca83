"""The chaos driver's invariants over API objects: devices and UltraServer nodes held twice."""

from __future__ import annotations

from typing import Any

from neuron_dra_common.driver import DRIVER_NAME, NODE_DEVICE

from chaos.invariants import devices_held_twice, nodes_held_twice


def claim(name: str, *held: tuple[str, str], driver: str = DRIVER_NAME) -> dict[str, Any]:
    results = [{"driver": driver, "pool": pool, "device": device} for pool, device in held]
    return {
        "metadata": {"name": name, "namespace": "chaos"},
        "status": {"allocation": {"devices": {"results": results}}} if results else {},
    }


def workload(name: str, *nodes: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "chaos"},
        "status": {"allocations": [{"nodes": [{"nodeName": n} for n in nodes]}]},
    }


def test_distinct_devices_and_unallocated_claims_are_fine() -> None:
    claims = [
        claim("a", ("n1", "neurondevice0"), ("n1", "neurondevice1")),
        claim("b", ("n1", "neurondevice2")),
        claim("c", ("n2", "neurondevice0")),
        claim("pending"),
    ]
    assert devices_held_twice(claims) == []


def test_one_device_in_two_claims_is_named_with_both() -> None:
    claims = [claim("a", ("n1", "neurondevice3")), claim("b", ("n1", "neurondevice3"))]
    assert devices_held_twice(claims) == ["n1/neurondevice3 held by chaos/a and chaos/b"]


def test_a_whole_node_claim_conflicts_with_any_device_of_that_node() -> None:
    claims = [claim("whole", ("n1", NODE_DEVICE)), claim("part", ("n1", "neurondevice7"))]
    assert devices_held_twice(claims) == ["n1 held whole by chaos/whole and in part by chaos/part"]
    # The same claim holding both is no conflict, nor is another node's device.
    assert devices_held_twice([claim("x", ("n1", NODE_DEVICE), ("n1", "neurondevice0"))]) == []
    assert devices_held_twice([claim("w", ("n1", NODE_DEVICE)), claim("o", ("n2", "d"))]) == []


def test_other_drivers_devices_are_not_ours_to_judge() -> None:
    other = "gpu.example.com"
    claims = [claim("a", ("n1", "gpu0"), driver=other), claim("b", ("n1", "gpu0"), driver=other)]
    assert devices_held_twice(claims) == []


def test_an_ultraserver_node_in_two_workloads() -> None:
    assert nodes_held_twice([workload("a", "u1", "u2"), workload("b", "u3", "u4")]) == []
    assert nodes_held_twice([workload("a", "u1", "u2"), workload("b", "u2")]) == [
        "node u2 held by chaos/a and chaos/b"
    ]
    assert nodes_held_twice([{"metadata": {"name": "new"}}]) == []
