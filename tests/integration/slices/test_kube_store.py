"""The slice store against the real apiserver: what it writes is what the API holds."""

from __future__ import annotations

from typing import Any

import pytest
from neuron_dra_common.hardware.model import NeuronDevice, NodeHardware
from neuron_dra_common.kube import RESOURCE_SLICES, KubeClient
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
