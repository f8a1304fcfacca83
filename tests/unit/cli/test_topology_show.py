"""``neuron-dra topology show``: the torus and the ring, with the claims holding devices."""

from __future__ import annotations

from typing import Any

import pytest
from neuron_dra_cli.errors import CliError
from neuron_dra_cli.topology_cmd import holders, render
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
