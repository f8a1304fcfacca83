"""A client of the local stack's apiserver, and a Node to own the slices a test writes."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from neuron_dra_common.kube import NODES, ApiException, KubeClient, connect
from neuron_dra_slice_publisher.pool import NodeRef

from tests.fixtures.stack import KubeStack


@pytest.fixture
async def kube(kube_stack: KubeStack) -> AsyncIterator[KubeClient]:
    client = await connect(kubeconfig=kube_stack.kubeconfig)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def owner_node(kube: KubeClient) -> AsyncIterator[NodeRef]:
    """A Node object without a kubelet (its slices go with it when the test deletes it).

    It has no inventory on the bus, so the stack's own slice publisher leaves its pool alone.
    """
    name = f"store-test-{uuid.uuid4().hex[:8]}"
    node = await kube.create(
        NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
    )
    try:
        yield NodeRef(name=name, uid=node["metadata"]["uid"])
    finally:
        try:
            await kube.delete(NODES, name)
        except ApiException as exc:
            if exc.status != 404:
                raise
