"""The operator's view of the fleet follows Node and slice changes, reading each slice once."""

from __future__ import annotations

from typing import Any

from neuron_dra_ultraserver_operator.discovery import discover, node_devices_only, slice_identities
from neuron_dra_ultraserver_operator.fleet import Fleet

Obj = dict[str, Any]


def node(name: str, *, ready: str = "True") -> Obj:
    return {
        "metadata": {
            "name": name,
            "labels": {"node.kubernetes.io/instance-type": "trn2u.48xlarge"},
        },
        "status": {"conditions": [{"type": "Ready", "status": ready}]},
    }


def neuron_slice(node_name: str, server: str, node_id: int, *, chips: int = 16) -> Obj:
    def attrs(**values: Any) -> dict[str, Any]:
        return {k: {"int": v} if isinstance(v, int) else {"string": v} for k, v in values.items()}

    devices = [
        {"name": f"neurondevice{i}", "attributes": attrs(resourceType="neuron_device")}
        for i in range(chips)
    ]
    devices.append(
        {
            "name": "neuron_node",
            "attributes": attrs(
                resourceType="neuron_node",
                ultraserverId=server,
                ultraserverNodeId=node_id,
                ultraserverModes="1,2,4",
            ),
        }
    )
    return {
        "metadata": {"name": f"{node_name}-neuron.aws.com-x"},
        "spec": {"driver": "neuron.aws.com", "nodeName": node_name, "devices": devices},
    }


def feed(fleet: Fleet, cache: dict[str, Obj], obj: Obj | None, key: str) -> bool:
    if obj is None:
        cache.pop(key, None)
    else:
        cache[key] = obj
    return fleet.changed(key, obj)


def test_views_follow_slices_and_nodes_as_discover_does() -> None:
    nodes: dict[str, Obj] = {}
    slices: dict[str, Obj] = {}
    fleet = Fleet(nodes, slices)
    for i in range(4):
        assert feed(fleet, nodes, node(f"n{i}"), f"n{i}")
        assert feed(fleet, slices, neuron_slice(f"n{i}", "aaaa1111", i), f"s{i}")
    views = fleet()
    assert views == discover(nodes.values(), slices.values())
    (only,) = views.values()
    assert [m.node_name for m in only.members] == ["n0", "n1", "n2", "n3"]
    assert only.modes == (1, 2, 4)

    # The same slice again (an echo, or a change discovery does not read): nothing to redo.
    assert not feed(fleet, slices, neuron_slice("n3", "aaaa1111", 3), "s3")
    assert not fleet.stale
    assert fleet() is views

    # A node moves to another UltraServer; another goes NotReady; a slice goes away.
    assert feed(fleet, slices, neuron_slice("n3", "bbbb2222", 0), "s3")
    assert feed(fleet, nodes, node("n1", ready="False"), "n1")
    assert feed(fleet, slices, None, "s2")
    assert fleet.stale
    views = fleet()
    assert views == discover(nodes.values(), slices.values())
    assert sorted(len(v.members) for v in views.values()) == [1, 2]
    assert not next(m for v in views.values() for m in v.members if m.node_name == "n1").healthy


def test_a_slice_listed_before_its_event_is_read_too() -> None:
    nodes = {"n0": node("n0")}
    slices = {"s0": neuron_slice("n0", "cccc3333", 0)}
    fleet = Fleet(nodes, slices)
    assert fleet() == discover(nodes.values(), slices.values())
    assert len(fleet()) == 1


def test_the_cached_slice_keeps_what_discovery_reads_and_drops_the_chips() -> None:
    full = neuron_slice("n0", "us-a", 2)
    full["metadata"].update(uid="u-1", resourceVersion="7", managedFields=[{"manager": "x"}])
    kept = node_devices_only(full)
    assert slice_identities([kept]) == slice_identities([full]) == {"n0": ("us-a", 2, (1, 2, 4))}
    assert [d["name"] for d in kept["spec"]["devices"]] == ["neuron_node"]
    assert kept["metadata"] == {
        "name": full["metadata"]["name"],
        "uid": "u-1",
        "resourceVersion": "7",
    }
    # A slice of chips only (a trn2 node) is kept with no devices, still a slice to the Fleet.
    chips = neuron_slice("n1", "us-a", 0)
    chips["spec"]["devices"] = chips["spec"]["devices"][:-1]
    nodes: dict[str, Obj] = {"n1": node("n1")}
    fleet = Fleet(nodes, {})
    assert fleet.changed("s1", node_devices_only(chips))
    assert not fleet.changed("s1", node_devices_only(chips))
    assert slice_identities([node_devices_only(chips)]) == {}
