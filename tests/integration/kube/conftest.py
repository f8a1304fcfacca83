"""A client of the local stack's apiserver for every test of the Kubernetes helpers."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from neuron_dra_common.kube import KubeClient, connect

from tests.fixtures.stack import KubeStack


@pytest.fixture
async def kube(kube_stack: KubeStack) -> AsyncIterator[KubeClient]:
    client = await connect(kubeconfig=kube_stack.kubeconfig)
    try:
        yield client
    finally:
        await client.close()
