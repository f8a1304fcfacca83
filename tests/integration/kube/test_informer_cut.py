"""The informer when the apiserver goes away mid-watch (a network cut, an apiserver restart):
the watch's stream ends half-way through a chunk, the informer keeps running, and once the
apiserver answers again its cache catches up with what changed meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import pytest
from neuron_dra_common.kube import CONFIGMAPS, ApiException, Informer, KubeClient, apply

from tests.contracts.support import wait_until
from tests.fixtures.stack import KubeStack
from tests.integration.kube.relay import relayed

pytestmark = pytest.mark.stack

NS = "default"


def config_map(name: str, label: str) -> dict[str, object]:
    return {
        "metadata": {"name": name, "namespace": NS, "labels": {"cut": label}},
        "data": {"k": "v"},
    }


async def test_a_watch_cut_mid_stream_resumes_and_misses_nothing(
    kube: KubeClient, kube_stack: KubeStack
) -> None:
    label = uuid.uuid4().hex[:8]
    relay, relay_port, cut_off = await relayed(kube_stack)
    informer = Informer(cut_off, CONFIGMAPS, namespace=NS, label_selector=f"cut={label}")
    running = asyncio.create_task(informer.run(), name="cut-informer")
    names = [f"cut-{label}-{i}" for i in range(2)]
    try:
        await asyncio.wait_for(informer.wait_synced(), 15)
        await apply(kube, CONFIGMAPS, config_map(names[0], label), field_manager="cut-test")
        await wait_until(
            lambda: f"{NS}/{names[0]}" in informer.cache,
            within=15,
            what="the first ConfigMap in the informer's cache",
        )
        # The open watch is dropped mid-stream and nothing answers for a while.
        await relay.cut()
        await apply(kube, CONFIGMAPS, config_map(names[1], label), field_manager="cut-test")
        await kube.delete(CONFIGMAPS, names[0], namespace=NS)
        await asyncio.sleep(1.0)
        assert not running.done(), f"the informer stopped: {running}"
        await relay.start(relay_port)
        await wait_until(
            lambda: set(informer.cache) == {f"{NS}/{names[1]}"},
            within=40,
            what="the informer's cache equal to the apiserver's after the cut",
        )
        assert not running.done()
    finally:
        informer.stop()
        await asyncio.gather(running, return_exceptions=True)
        await cut_off.close()
        await relay.cut()
        for name in names:
            with contextlib.suppress(ApiException):  # the test deleted it already
                await kube.delete(CONFIGMAPS, name, namespace=NS)
    assert running.exception() is None
