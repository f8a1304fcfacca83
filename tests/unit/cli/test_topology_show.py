"""``neuron-dra topology show``: the torus and the ring, with the claims holding devices."""

from __future__ import annotations

from typing import Any

import pytest
from neuron_dra_cli.errors import CliError
from neuron_dra_cli.topology_cmd import holders, render, view
from neuron_dra_slice_publisher.pool import NodeRef, render_slice
from neuron_dra_slice_publisher.slices import NodeDeviceMode, build_pool

from tests.unit.slices.support import hardware


def slices(node: str, instance_type: str, **kw: Any) -> list[dict[str, Any]]:
    content = build_pool(
        node=node,
        hardware=hardware(instance_type, **kw),
        labels={},
        mode=NodeDeviceMode.COUNTERS,
        dra_driver_version="0.1.0",
    )
    n = len(content.slices)
    return [
        render_slice(s, owner=NodeRef(name=node, uid="u"), index=i, generation=1, count=n)
        for i, s in enumerate(content.slices)
    ]


def claim(name: str, node: str, devices: list[str]) -> dict[str, Any]:
    results = [
        {"request": "r", "driver": "neuron.aws.com", "pool": node, "device": d} for d in devices
    ]
    return {
        "metadata": {"name": name, "namespace": "default"},
        "status": {"allocation": {"devices": {"results": results}}},
    }


def test_trn2_is_a_torus_with_each_claim_marked() -> None:
    out = render(
        node="n1",
        slices=slices("n1", "trn2.48xlarge"),
        claims=[
            claim("a", "n1", [f"neurondevice{i}" for i in range(4, 8)]),
            claim("other-node", "n2", ["neurondevice0"]),
        ],
    )
    assert "trn2.48xlarge" in out
    assert "row 1 [ 4 A]-[ 5 A]-[ 6 A]-[ 7 A]  ↺" in out
    assert "row 0 [ 0 .]-[ 1 .]-[ 2 .]-[ 3 .]  ↺" in out
    assert "A  default/a" in out
    assert "4 held" in out


def test_inf2_is_a_ring() -> None:
    out = render(node="i1", slices=slices("i1", "inf2.48xlarge"), claims=[])
    assert "[ 0 .]-[ 1 .]" in out
    assert "[11 .]  ↺ (ring)" in out
    assert "no claims hold devices" in out


def test_ultraserver_node_device_shows_its_holder() -> None:
    out = render(
        node="u1",
        slices=slices("u1", "trn2u.48xlarge", ultraserver_node=0),
        claims=[claim("whole", "u1", ["neuronnode"])],
    )
    assert "node device neuronnode (whole node): held by A" in out


def test_unknown_node_says_what_is_missing() -> None:
    with pytest.raises(CliError, match=r"node ghost: no neuron\.aws\.com ResourceSlices"):
        render(node="ghost", slices=[], claims=[])


def test_holders_ignores_other_drivers() -> None:
    c = claim("x", "n1", ["gpu0"])
    c["status"]["allocation"]["devices"]["results"][0]["driver"] = "gpu.example.com"
    assert holders([c], "n1") == {}


def test_a_claim_on_the_node_device_holds_every_device_of_the_node() -> None:
    out = render(
        node="u1",
        slices=slices("u1", "trn2u.48xlarge", ultraserver_node=0),
        claims=[claim("whole", "u1", ["neuronnode"])],
    )
    assert "(16 devices, 16 held)" in out
    assert "row 3 [12 A]-[13 A]-[14 A]-[15 A]  ↺" in out
    assert "node device neuronnode (whole node): held by A (all 16 devices)" in out


def test_json_view_names_the_holder_of_each_device() -> None:
    shown = view(
        node="u1",
        slices=slices("u1", "trn2u.48xlarge", ultraserver_node=0),
        claims=[claim("whole", "u1", ["neuronnode"]), claim("x", "u2", ["neurondevice0"])],
    )
    assert (shown["devices"], shown["held"]) == (16, 16)
    assert {c["heldBy"] for c in shown["chips"]} == {"default/whole"}
    assert shown["nodeDevices"] == [{"name": "neuronnode", "heldBy": "default/whole", "taints": []}]
    assert shown["chips"][5] == {
        "name": "neurondevice5",
        "deviceId": 5,
        "row": 1,
        "column": 1,
        "heldBy": "default/whole",
        "taints": [],
    }
    assert shown["claims"] == ["default/whole"]


def test_a_node_publishing_only_its_node_device_counts_its_devices() -> None:
    content = build_pool(
        node="u1",
        hardware=hardware("trn2u.48xlarge", ultraserver_node=0),
        labels={},
        mode=NodeDeviceMode.NODE_ONLY,
        dra_driver_version="0.1.0",
    )
    only_node = [
        render_slice(s, owner=NodeRef(name="u1", uid="u"), index=i, generation=1, count=1)
        for i, s in enumerate(content.slices)
    ]
    free = view(node="u1", slices=only_node, claims=[])
    taken = view(node="u1", slices=only_node, claims=[claim("whole", "u1", ["neuronnode"])])
    assert (free["devices"], free["held"]) == (16, 0)
    assert (taken["devices"], taken["held"]) == (16, 16)


def test_tainted_devices_are_flagged_and_listed() -> None:
    content = build_pool(
        node="n1",
        hardware=hardware("trn2.48xlarge"),
        labels={},
        mode=NodeDeviceMode.COUNTERS,
        dra_driver_version="0.1.0",
        taints={
            "neurondevice9": [
                {
                    "key": "neuron.aws.com/hardware-error",
                    "value": "DMA_ERROR",
                    "effect": "NoExecute",
                }
            ],
            "neurondevice1": [
                {
                    "key": "neuron.aws.com/hardware-error",
                    "value": "NEURONLINK_DOWN",
                    "effect": "NoSchedule",
                }
            ],
        },
    )
    n = len(content.slices)
    pool = [
        render_slice(s, owner=NodeRef(name="n1", uid="u"), index=i, generation=1, count=n)
        for i, s in enumerate(content.slices)
    ]
    out = render(node="n1", slices=pool, claims=[claim("a", "n1", ["neurondevice9"])])
    assert "[ 9!A]" in out
    assert "[ 1~.]" in out
    assert "[ 0 .]" in out
    assert "!  neurondevice9  neuron.aws.com/hardware-error=DMA_ERROR:NoExecute" in out
    assert "~  neurondevice1  neuron.aws.com/hardware-error=NEURONLINK_DOWN:NoSchedule" in out
    shown = view(node="n1", slices=pool, claims=[])
    assert shown["chips"][9]["taints"] == [
        {"key": "neuron.aws.com/hardware-error", "value": "DMA_ERROR", "effect": "NoExecute"}
    ]
    assert shown["chips"][0]["taints"] == []


def test_a_monitoring_claim_holds_nothing() -> None:
    monitor = claim("monitor", "n1", [f"neurondevice{i}" for i in range(16)])
    for result in monitor["status"]["allocation"]["devices"]["results"]:
        result["adminAccess"] = True
    assert holders([claim("job", "n1", ["neurondevice3"]), monitor], "n1") == {
        "neurondevice3": "default/job"
    }
