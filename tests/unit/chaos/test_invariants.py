"""The chaos driver's invariants over API objects: devices and UltraServer nodes held twice."""

from __future__ import annotations

from typing import Any

from neuron_dra_common.driver import DRIVER_NAME, NODE_DEVICE

from chaos.invariants import audit_mismatches, devices_held_twice, nodes_held_twice


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


def event(
    ident: str, kind: str, node: str, name: str, uid: str, ns: str = "chaos"
) -> dict[str, Any]:
    claim = {"namespace": ns, "name": name, "uid": uid}
    return {"id": ident, "data": {"type": f"claim.{kind}.v1", "node": node, "claim": claim}}


def test_the_audit_reconciles_with_the_running_claims() -> None:
    lines = [
        event("1", "prepared", "n1", "a", "u1"),
        event("2", "prepared", "n1", "b", "u2"),
        event("3", "unprepared", "n1", "b", "u2"),
        event("4", "prepared", "n2", "c", "u3"),
        # Prepared again after the plugin restarted: the same claim, still one claim.
        event("5", "prepared", "n2", "c", "u3"),
        # Another namespace is not the run's.
        event("6", "prepared", "n2", "x", "u9", ns="default"),
        {"id": "7", "data": {"type": "node.heartbeat.v1", "node": "n1"}},
    ]
    running = {("n1", "u1"): "chaos/a", ("n2", "u3"): "chaos/c"}
    assert audit_mismatches(lines, running, namespace="chaos") == []


def test_audit_mismatches_name_the_claim_node_and_what_is_wrong() -> None:
    lines = [
        event("1", "prepared", "n1", "a", "u1"),
        event("1", "prepared", "n1", "a", "u1"),
        event("2", "prepared", "n2", "gone", "u2"),
    ]
    running = {("n1", "u1"): "chaos/a", ("n1", "u3"): "chaos/new"}
    assert audit_mismatches(lines, running, namespace="chaos") == [
        "event 1 written twice",
        "claim chaos/new (u3) runs on n1 but the audit never showed it prepared there",
        "claim chaos/gone (u2) is prepared on n2 by the audit, but no pod of it runs",
    ]


def test_a_deleted_workload_deallocating_still_holds_what_its_status_lists() -> None:
    gone = workload("a", "n1")
    gone["metadata"]["deletionTimestamp"] = "2026-11-28T16:00:00Z"
    gone["status"]["state"] = "Deallocating"
    assert nodes_held_twice([gone, workload("b", "n1")]) == ["node n1 held by chaos/a and chaos/b"]
    gone["status"]["allocations"] = []
    assert nodes_held_twice([gone, workload("b", "n1")]) == []
