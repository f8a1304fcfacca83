"""``explain_workload``: per UltraServer whole and healthy, partial and why, held; and
``NotUltraServerOfWorkload`` on a workload pod's nodes outside the UltraServers it holds.

The UltraServers are the operator's own objects (``discover`` + ``ultraserver_object``) over
pools from the slice publisher's ``build_pool``."""

from __future__ import annotations

import json
from typing import Any

from neuron_dra_common.explain import Snapshot, explain_workload, render_text, to_json
from neuron_dra_common.ultraserver import (
    NODE_ID_4_LABEL,
    SERVER_ID_4_LABEL,
    WORKLOAD_LABEL,
    ultraserver_name,
)
from neuron_dra_ultraserver_operator.discovery import discover
from neuron_dra_ultraserver_operator.manifests import ultraserver_object

from tests.unit.explain.cluster import NEURON_CLASS, claim, node, request, slices

ITYPE = "trn2u.48xlarge"
SERVERS = {"us-a": "0a1b2c3d4e5f6071", "us-b": "1a1b2c3d4e5f6072"}
#: node name prefix -> NeuronUltraServer name
US = {prefix: ultraserver_name(server) for prefix, server in SERVERS.items()}


def _fleet(**node_spec: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    nodes, all_slices = [], []
    for prefix, server in SERVERS.items():
        for i in range(4):
            name = f"{prefix}-{i}"
            labels = {SERVER_ID_4_LABEL: server, NODE_ID_4_LABEL: str(i)}
            obj = node(name, ITYPE, **node_spec.get(name, {}))
            obj["metadata"]["labels"].update(labels)
            nodes.append(obj)
            all_slices += slices(name, ITYPE, labels=labels)
    return nodes, all_slices


def _ultraservers(nodes: list[dict[str, Any]], slices: list[dict[str, Any]]) -> list[Any]:
    views = discover(nodes, slices)
    return [ultraserver_object(v) for v in views.values()]


def _workload(
    name: str = "wl", *, count: int = 1, size: int = 4, holds: str = ""
) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if holds:
        status = {
            "state": "Allocated",
            "resourceClaimTemplate": f"{name}-claims",
            "allocations": [
                {
                    "ultraServer": US[holds],
                    "serverId": "x",
                    "ultraserverIndex": 0,
                    "mode": 1,
                    "leaderNodeName": f"{holds}-0",
                    "nodes": [
                        {"nodeName": f"{holds}-{i}", "nodeId": i, "topologyId": i} for i in range(4)
                    ],
                }
            ],
        }
    return {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {"instanceType": ITYPE, "topologySize": size, "serverCount": count},
        "status": status,
    }


def _by_name(exp_json: bytes) -> dict[str, Any]:
    data = json.loads(exp_json)
    return {u["name"]: u for u in data["workload"]["ultraServers"]}


def test_whole_partial_and_why_per_node() -> None:
    nodes, all_slices = _fleet(**{"us-b-2": {"unschedulable": True}})
    us = _ultraservers(nodes, all_slices)
    # A claim of another workload holds a chip of us-a-1.
    holder = claim("other-0", request(), allocated_on="us-a-1", devices=["neurondevice3"])
    holder["metadata"]["labels"] = {WORKLOAD_LABEL: "other"}
    snap = Snapshot.build(
        nodes=nodes,
        slices=all_slices,
        claims=[holder],
        classes=[NEURON_CLASS],
        workloads=[_workload(count=1)],
        ultraservers=us,
    )
    exp = explain_workload(snap, "default", "wl")
    servers = _by_name(to_json(exp))
    assert [servers[n]["state"] for n in (US["us-a"], US["us-b"])] == ["partial", "partial"]
    bad_a = [n for n in servers[US["us-a"]]["nodes"] if not n["ok"]]
    assert [(n["node"], n["code"], n["heldBy"]) for n in bad_a] == [
        ("us-a-1", "DevicesHeld", "default/other")
    ]
    bad_b = [n for n in servers[US["us-b"]]["nodes"] if not n["ok"]]
    assert [(n["node"], n["code"]) for n in bad_b] == [("us-b-2", "NodeUnschedulable")]
    assert not exp.summary.schedulable
    assert exp.top_code() == "NodeUnschedulable"
    assert exp.event_message().startswith("NodeUnschedulable: 0 of 1 4-node units free")
    text = render_text(exp)
    assert f"UltraServer {US['us-a']}: partial (3 of 4 nodes usable)" in text
    assert "us-b-2 (node 2): NodeUnschedulable" in text


def test_two_node_units_fit_on_a_partial_ultraserver() -> None:
    nodes, all_slices = _fleet(**{"us-a-3": {"unschedulable": True}})
    snap = Snapshot.build(
        nodes=nodes,
        slices=all_slices,
        workloads=[_workload(count=3, size=2)],
        ultraservers=_ultraservers(nodes, all_slices),
    )
    exp = explain_workload(snap, "default", "wl")
    assert exp.workload is not None
    # us-a keeps its vertical pair {0, 1}; us-b is whole: 1 + 2 units.
    assert exp.workload["usableUnits"] == 3
    assert exp.workload["whole"] == 1
    assert exp.summary.schedulable
    assert exp.top_code() == ""


def test_not_ultraserver_of_workload_outside_held() -> None:
    nodes, all_slices = _fleet()
    wl = _workload(holds="us-a")
    sel = (
        "device.attributes['neuron.aws.com'].resourceType == 'neuron_node' && "
        f"device.attributes['neuron.aws.com'].ultraserverId == '{SERVERS['us-a']}'"
    )
    pod_claim = claim("wl-claims-p", request("neurons", 1, sel))
    pod_claim["metadata"]["labels"] = {WORKLOAD_LABEL: "wl"}
    pod = {
        "metadata": {"name": "p", "namespace": "default", "uid": "uid-p"},
        "spec": {
            "containers": [{"name": "main", "image": "busybox"}],
            "resourceClaims": [{"name": "neurons", "resourceClaimTemplateName": "wl-claims"}],
        },
        "status": {
            "resourceClaimStatuses": [{"name": "neurons", "resourceClaimName": "wl-claims-p"}]
        },
    }
    pod_claim["metadata"]["ownerReferences"] = [{"uid": "uid-p"}]
    snap = Snapshot.build(
        pods=[pod],
        nodes=nodes,
        slices=all_slices,
        claims=[pod_claim],
        classes=[NEURON_CLASS],
        workloads=[wl],
        ultraservers=_ultraservers(nodes, all_slices),
    )
    exp = explain_workload(snap, "default", "wl")
    assert exp.summary.schedulable
    assert {n for n, e in exp.nodes.items() if e.verdict == "fits"} == {
        f"us-a-{i}" for i in range(4)
    }
    outside = [g for g in exp.groups if g.verdict == "does-not-fit"]
    assert len(outside) == 1
    assert outside[0].nodes == [f"us-b-{i}" for i in range(4)]
    assert outside[0].reasons[0].code == "NotUltraServerOfWorkload"
    assert (
        f"in UltraServer {US['us-b']}; the workload holds {US['us-a']}"
        in outside[0].reasons[0].message
    )
    servers = _by_name(to_json(exp))
    assert servers[US["us-a"]]["state"] == "held"
    assert servers[US["us-b"]]["state"] == "whole"
    assert exp.workload is not None
    assert exp.workload["pendingPods"] == ["p"]


def test_each_reason_a_node_is_not_usable() -> None:
    nodes, all_slices = _fleet()
    # us-a-0: no pool; us-a-1: a chip tainted NoSchedule; us-a-3: NotReady.
    all_slices = [s for s in all_slices if s["spec"]["nodeName"] != "us-a-0"]
    all_slices = [s for s in all_slices if s["spec"]["nodeName"] != "us-a-1"] + slices(
        "us-a-1",
        ITYPE,
        labels={SERVER_ID_4_LABEL: SERVERS["us-a"], NODE_ID_4_LABEL: "1"},
        taints={
            "neurondevice5": [{"key": "neuron.aws.com/hbm", "value": "ecc", "effect": "NoSchedule"}]
        },
    )
    nodes[3]["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    us = _ultraservers(nodes, slices=all_slices)
    # us-b's nodes 0 and 1 are allocated to another workload (the NeuronUltraServer's status).
    for obj in us:
        if obj["metadata"]["name"] == US["us-b"]:
            obj["status"] = {
                "allocations": [
                    {"workloadRef": "team/other", "allocatedNodes": ["us-b-0", "us-b-1"]}
                ]
            }
    snap = Snapshot.build(
        nodes=nodes,
        slices=all_slices,
        classes=[NEURON_CLASS],
        workloads=[_workload(count=1, size=2)],
        ultraservers=us,
    )
    exp = explain_workload(snap, "default", "wl")
    servers = _by_name(to_json(exp))
    said = {n["node"]: n.get("code", "") for s in servers.values() for n in s["nodes"]}
    assert said == {
        "us-a-0": "NoPool",
        "us-a-1": "DeviceTainted",
        "us-a-2": "",
        "us-a-3": "NodeNotReady",
        "us-b-0": "DevicesHeld",
        "us-b-1": "DevicesHeld",
        "us-b-2": "",
        "us-b-3": "",
    }
    held = [n for n in servers[US["us-b"]]["nodes"] if n.get("heldBy")]
    assert {n["heldBy"] for n in held} == {"team/other"}
    # us-b keeps its vertical pair {2, 3}: one 2-node unit, which is what the workload asks.
    assert exp.workload is not None
    assert exp.workload["usableUnits"] == 1
    assert exp.summary.schedulable
    assert render_text(exp).startswith(
        "NeuronUltraServerWorkload default/wl: enough free UltraServers; the operator can place it"
    )


def test_too_few_ultraservers_when_all_are_whole() -> None:
    nodes, all_slices = _fleet()
    snap = Snapshot.build(
        nodes=nodes,
        slices=all_slices,
        workloads=[_workload(count=3)],
        ultraservers=_ultraservers(nodes, all_slices),
    )
    exp = explain_workload(snap, "default", "wl")
    assert exp.top_code() == "NotEnoughDevices"
    assert exp.event_message().startswith("NotEnoughDevices: 2 of 3 4-node units free")
    assert exp.summary.fits == 0
    assert exp.nodes == {}


def test_a_workload_that_holds_its_ultraservers_and_has_no_pending_pod() -> None:
    nodes, all_slices = _fleet()
    snap = Snapshot.build(
        nodes=nodes,
        slices=all_slices,
        workloads=[_workload(holds="us-a")],
        ultraservers=_ultraservers(nodes, all_slices),
    )
    exp = explain_workload(snap, "default", "wl")
    assert exp.summary.schedulable
    assert render_text(exp).startswith(
        f"NeuronUltraServerWorkload default/wl: holds {US['us-a']}; no pod waits"
    )


def test_ultraservers_of_another_instance_type_are_not_listed() -> None:
    nodes, all_slices = _fleet()
    wl = _workload()
    wl["spec"]["instanceType"] = "Trn3pds"
    snap = Snapshot.build(
        nodes=nodes,
        slices=all_slices,
        workloads=[wl],
        ultraservers=_ultraservers(nodes, all_slices),
    )
    exp = explain_workload(snap, "default", "wl")
    assert exp.workload is not None
    assert exp.workload["ultraServers"] == []
    assert exp.event_message() == (
        "NotEnoughDevices: 0 of 1 4-node units free on 0 Trn3pds UltraServers"
    )
