"""Exactly one slice publisher writes: the Lease on the real apiserver admits one holder, and
a standby takes over only once the holder stopped renewing."""

from __future__ import annotations

import asyncio

import pytest
from neuron_dra_common.kube import connect
from neuron_dra_slice_publisher.leader import LEASES, Elector, read_lease

from tests.fixtures.stack import KubeStack

pytestmark = pytest.mark.stack


async def test_one_holder_and_takeover_after_expiry(describe_stack: KubeStack) -> None:
    client = await connect(kubeconfig=describe_stack.kubeconfig)
    try:
        common = {
            "namespace": "neuron-dra-driver",
            "name": "single-writer-test",
            "lease_seconds": 2.0,
        }
        a = Elector(client, identity="replica-a", **common)  # type: ignore[arg-type]
        b = Elector(client, identity="replica-b", **common)  # type: ignore[arg-type]
        assert await a.try_hold()
        assert not await b.try_hold(), "a second replica must not take a live lease"
        assert await a.try_hold(), "the holder renews"
        # Both try at once: the resourceVersion lets only one win.
        await asyncio.sleep(2.2)
        won = await asyncio.gather(a.try_hold(), b.try_hold())
        assert sorted(won) == [False, True], "exactly one of two simultaneous tries wins"
        lease = await client.get(LEASES, "single-writer-test", namespace="neuron-dra-driver")
        holder = read_lease(lease).holder
        assert holder in {"replica-a", "replica-b"}
        assert (holder == "replica-a") == won[0]
    finally:
        await client.close()


async def test_the_stack_publisher_holds_the_lease(describe_stack: KubeStack) -> None:
    lease = describe_stack.get_json(
        "lease", "neuron-dra-slice-publisher", "-n", "neuron-dra-driver"
    )
    assert lease["spec"]["holderIdentity"] == "local"


async def test_shared_counters_are_detected_on_this_release(describe_stack: KubeStack) -> None:
    """1.36 serves partitionable devices: the publisher picks counters by itself."""
    from neuron_dra_slice_publisher.slices import NodeDeviceMode
    from neuron_dra_slice_publisher.wiring import detect_mode

    client = await connect(kubeconfig=describe_stack.kubeconfig)
    try:
        assert await detect_mode(client, "auto") is NodeDeviceMode.COUNTERS
        assert await detect_mode(client, "node-only") is NodeDeviceMode.NODE_ONLY
    finally:
        await client.close()
    assert describe_stack.get_json("resourceslices")["items"] != []
    names = {s["metadata"]["name"] for s in describe_stack.get_json("resourceslices")["items"]}
    assert "neuron-dra-shared-counter-probe" not in names, "the probe was a dry run"
