"""The slice store against the real apiserver: what it writes is what the API holds."""

from __future__ import annotations

import copy
from typing import Any, cast

import pytest
from neuron_dra_common.hardware.model import NeuronDevice, NodeHardware
from neuron_dra_common.kube import PROTOBUF, RESOURCE_SLICES, KubeClient
from neuron_dra_slice_publisher.pool import NodeRef, render_slice, stored_slice
from neuron_dra_slice_publisher.slices import NodeDeviceMode, build_pool
from neuron_dra_slice_publisher.store import Conflict, KubeSliceStore

pytestmark = pytest.mark.stack


def trn2_bodies(owner: NodeRef, *, generation: int, driver: str) -> list[dict[str, Any]]:
    hardware = NodeHardware(
        instance_type="trn2.48xlarge",
        driver_version=driver,
        devices=tuple(NeuronDevice(index=i) for i in range(16)),
    )
    content = build_pool(
        node=owner.name,
        hardware=hardware,
        labels={"topology.k8s.aws/network-node-layer-1": "nn-1"},
        mode=NodeDeviceMode.COUNTERS,
        dra_driver_version="0.1.0",
    )
    count = len(content.slices)
    return [
        render_slice(part, owner=owner, index=i, generation=generation, count=count)
        for i, part in enumerate(content.slices)
    ]


async def test_creates_and_replaces_answer_with_the_slices_metadata_only(
    kube: KubeClient, owner_node: NodeRef
) -> None:
    store = KubeSliceStore(kube)
    (body,) = trn2_bodies(owner_node, generation=1, driver="2.24.7.0")
    name = body["metadata"]["name"]
    created = await store.create(body)
    try:
        assert created["kind"] == "PartialObjectMetadata"
        assert "spec" not in created
        assert "managedFields" not in created["metadata"]
        seen = stored_slice(created)
        assert (seen.name, seen.pool, seen.generation, seen.slice_count) == (
            name,
            owner_node.name,
            1,
            1,
        )
        assert seen.owner_uid == owner_node.uid
        assert seen.content_hash == body["metadata"]["annotations"]["neuron.aws.com/content-hash"]
        full = await kube.get(RESOURCE_SLICES, name)
        assert full["metadata"]["resourceVersion"] == seen.resource_version
        assert full["metadata"]["uid"] == created["metadata"]["uid"]

        (changed,) = trn2_bodies(owner_node, generation=2, driver="2.30.0.0")
        replaced = stored_slice(
            await store.replace(name, changed, resource_version=seen.resource_version)
        )
        assert replaced.generation == 2
        assert int(replaced.resource_version) > int(seen.resource_version)
        assert "resourceVersion" not in changed["metadata"]  # the caller's body is untouched
        with pytest.raises(Conflict):
            await store.replace(name, changed, resource_version=seen.resource_version)
        with pytest.raises(Conflict):
            await store.create(changed)
    finally:
        await store.delete(name)


def trn2u_bodies(owner: NodeRef) -> list[dict[str, Any]]:
    """An UltraServer node's pool with shared counters, plus an attribute of every kind."""
    hardware = NodeHardware(
        instance_type="trn2u.48xlarge",
        driver_version="2.24.7.0",
        devices=tuple(NeuronDevice(index=i, numa_node=i // 8) for i in range(16)),
    )
    content = build_pool(
        node=owner.name,
        hardware=hardware,
        labels={
            "topology.k8s.aws/capacity-block-id": "cr-0123456789",
            "neuron.amazonaws.com/ultraserver-server-id-4": "us-test-1",
            "neuron.amazonaws.com/ultraserver-node-id-4": "2",
        },
        mode=NodeDeviceMode.COUNTERS,
        dra_driver_version="0.1.0",
    )
    count = len(content.slices)
    bodies = [
        render_slice(part, owner=owner, index=i, generation=1, count=count)
        for i, part in enumerate(content.slices)
    ]
    # The pool has no bool or version attribute of its own: add them, with zero values.
    first = bodies[-1]["spec"]["devices"][0]
    first["attributes"] |= {
        "healthy": {"bool": True},
        "degraded": {"bool": False},
        "firmwareVersion": {"version": "1.14.2"},
        "emptyLabel": {"string": ""},
        "offset": {"int": -3},
    }
    return bodies


def kinds(bodies: list[dict[str, Any]]) -> set[str]:
    return {
        kind
        for body in bodies
        for device in body["spec"].get("devices", ())
        for value in device["attributes"].values()
        for kind in value
    }


async def test_protobuf_writes_read_back_as_the_rendered_slices(
    kube: KubeClient, owner_node: NodeRef
) -> None:
    store = KubeSliceStore(kube, encoding="protobuf")
    bodies = trn2u_bodies(owner_node)
    assert kinds(bodies) == {"int", "bool", "string", "version"}
    assert "sharedCounters" in bodies[0]["spec"]
    assert any("consumesCounters" in d for d in bodies[-1]["spec"]["devices"])
    names = [body["metadata"]["name"] for body in bodies]
    assert all(store._body(body)[1] == PROTOBUF for body in bodies)
    try:
        for body in bodies:
            await store.create(body)
        for body in bodies:
            stored = await kube.get(RESOURCE_SLICES, body["metadata"]["name"])
            assert_same_slice(stored, body)
        # A replace in protobuf carries the resourceVersion and the new content.
        first = await kube.get(RESOURCE_SLICES, names[-1])
        changed = copy.deepcopy(bodies[-1])
        changed["spec"]["pool"]["generation"] = 2
        changed["spec"]["devices"][0]["attributes"]["firmwareVersion"] = {"version": "1.15.0"}
        await store.replace(
            names[-1], changed, resource_version=first["metadata"]["resourceVersion"]
        )
        assert_same_slice(await kube.get(RESOURCE_SLICES, names[-1]), changed)
    finally:
        for name in names:
            await store.delete(name)


async def test_protobuf_and_json_writes_store_the_same_object(
    kube: KubeClient, owner_node: NodeRef
) -> None:
    proto, plain = KubeSliceStore(kube), KubeSliceStore(kube, encoding="json")
    body = trn2u_bodies(owner_node)[-1]
    twin = copy.deepcopy(body)
    twin["metadata"]["name"] += "-json"
    try:
        await proto.create(body)
        await plain.create(twin)
        a = await kube.get(RESOURCE_SLICES, body["metadata"]["name"])
        b = await kube.get(RESOURCE_SLICES, twin["metadata"]["name"])
        assert a["spec"] == b["spec"]
        for key in ("labels", "annotations", "ownerReferences"):
            assert a["metadata"][key] == b["metadata"][key]
    finally:
        await proto.delete(body["metadata"]["name"])
        await proto.delete(twin["metadata"]["name"])


def test_a_field_without_a_protobuf_twin_goes_as_json() -> None:
    body = trn2u_bodies(NodeRef(name="n", uid="u"))[-1]
    body["spec"]["devices"][0]["bindsToNode"] = True
    store = KubeSliceStore(cast(KubeClient, None))
    data, content_type = store._body(body)
    assert (data, content_type) == (body, "application/json")


def assert_same_slice(stored: dict[str, Any], body: dict[str, Any]) -> None:
    """Field by field, so a difference names where it is."""
    assert stored["apiVersion"] == body["apiVersion"]
    assert stored["kind"] == body["kind"]
    meta, want = stored["metadata"], body["metadata"]
    assert meta["name"] == want["name"]
    assert meta["labels"] == want["labels"]
    assert meta["annotations"] == want["annotations"]
    assert meta["ownerReferences"] == want["ownerReferences"]
    spec, wanted = stored["spec"], body["spec"]
    assert set(spec) == set(wanted)
    for key in ("driver", "nodeName", "pool"):
        assert spec[key] == wanted[key], key
    assert spec.get("sharedCounters") == wanted.get("sharedCounters")
    assert [d["name"] for d in spec.get("devices", ())] == [
        d["name"] for d in wanted.get("devices", ())
    ]
    for got, device in zip(spec.get("devices", ()), wanted.get("devices", ()), strict=True):
        assert set(got) == set(device), device["name"]
        assert got["attributes"] == device["attributes"], device["name"]
        assert got["capacity"] == device["capacity"], device["name"]
        assert got.get("consumesCounters") == device.get("consumesCounters"), device["name"]
