"""A NATS server restart in the middle of a stream loses nothing and applies nothing twice."""

from __future__ import annotations

import asyncio
from collections import Counter

from neuron_dra_common.bus import Bus, ConsumerSpec, Delivery, RunnerOptions
from neuron_dra_common.bus.declarations import HEALTH
from neuron_dra_common.events import AnyEvent, DeviceHealthChanged

from tests.contracts.support import running, wait_until
from tests.fixtures.nats import NatsServer

TOTAL = 10_000
CHUNK = 500
SPEC = ConsumerSpec(stream=HEALTH.name, durable="test-restart", ack_wait_seconds=2.0)


def event(i: int) -> DeviceHealthChanged:
    return DeviceHealthChanged(
        node=f"node-{i % 8}",
        device=f"neurondevice{i % 16}",
        health="Unhealthy" if i % 2 else "Healthy",
        reason=f"event {i}",
    )


async def test_restart_mid_stream_loses_none_and_applies_none_twice(
    nats_server: NatsServer,
) -> None:
    publishing = await Bus.connect([nats_server.url], name="test-publisher")
    consuming = await Bus.connect([nats_server.url], name="test-consumer")
    await publishing.reconcile(streams=[HEALTH])
    applied: Counter[str] = Counter()

    async def apply(ev: AnyEvent, delivery: Delivery) -> None:
        applied[delivery.msg_id] += 1

    async def publish_all() -> None:
        pub = publishing.publisher(source="/test/restart", ack_timeout=1.0)
        for start in range(0, TOTAL, CHUNK):
            ids = [f"ev-{i}" for i in range(start, start + CHUNK)]
            await pub.publish_many([event(i) for i in range(start, start + CHUNK)], msg_ids=ids)
            # Paced like a service, so the restart lands while both sides are busy.
            await asyncio.sleep(0.05)

    options = RunnerOptions(backoff=(0.05,))
    try:
        async with running(consuming.runner(SPEC, apply, options=options)):
            publisher = asyncio.create_task(publish_all(), name="publish-all")
            await wait_until(lambda: len(applied) >= TOTAL // 3, what="a third applied")
            assert not publisher.done(), "publisher finished before the restart"
            await nats_server.restart_async(down_for=0.5)
            await asyncio.wait_for(publisher, 60)
            await wait_until(lambda: len(applied) >= TOTAL, within=60, what="all applied")
            # Give redeliveries of acks lost in the restart time to arrive (ack wait is 2s).
            await asyncio.sleep(2.5)
        reconnects = (publishing.nc.stats["reconnects"], consuming.nc.stats["reconnects"])
    finally:
        await publishing.close()
        await consuming.close()

    assert set(applied) == {f"ev-{i}" for i in range(TOTAL)}
    twice = {k: n for k, n in applied.items() if n > 1}
    assert not twice, f"applied more than once: {sorted(twice)[:10]}"
    assert reconnects == (1, 1), "both clients should have lived through one restart"
    check = await Bus.connect([nats_server.url], name="test-check")
    try:
        info = await check.js.stream_info(HEALTH.name)
    finally:
        await check.close()
    assert info.state.messages == TOTAL, "a retried publish was stored twice"
