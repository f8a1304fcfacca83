"""Replaying a stream into memory: all of it in order, or the latest per subject, then follow."""

from __future__ import annotations

import asyncio

from neuron_dra_common.bus import Bus, Follower, PermanentError, StoredMessage, read_history, replay
from neuron_dra_common.bus.declarations import HEALTH, INVENTORY
from neuron_dra_common.events import AnyEvent, DeviceHealthChanged

from tests.contracts.support import dead_letters, wait_until

READER = "test-reader"


def health(node: str, device: int, reason: str) -> DeviceHealthChanged:
    return DeviceHealthChanged(
        node=node, device=f"neurondevice{device}", health="Unhealthy", reason=reason
    )


def reasons(events: list[AnyEvent]) -> list[str]:
    return [e.reason for e in events if isinstance(e, DeviceHealthChanged)]


async def test_replay_of_an_empty_stream_returns_at_once(nats_bus: Bus) -> None:
    stored = await asyncio.wait_for(
        replay(nats_bus, name=READER, stream=INVENTORY.name, subject=INVENTORY.subjects[0]), 5
    )
    assert stored == []


async def test_replay_reads_everything_stored_in_order_and_dead_letters_what_it_refuses(
    nats_bus: Bus,
) -> None:
    pub = nats_bus.publisher(source="/test")
    await pub.publish_many([health("node-a", i % 3, f"r{i}") for i in range(10)])
    await nats_bus.js.publish("neuron.health.node-a.neurondevice0", b"not an event")
    await pub.publish(health("node-b", 0, "r10"))
    stored = await replay(nats_bus, name=READER, stream=HEALTH.name, subject="neuron.health.>")
    assert reasons(stored) == [f"r{i}" for i in range(11)]
    [record] = await dead_letters(nats_bus)
    assert (record.consumer, record.kind, record.payload) == (READER, "decode", b"not an event")
    assert "not JSON" in record.reason
    # Read again (a restart): the same stored message is one dead letter, not two.
    await replay(nats_bus, name=READER, stream=HEALTH.name, subject="neuron.health.>")
    assert len(await dead_letters(nats_bus)) == 1


async def test_replay_of_the_latest_per_subject(nats_bus: Bus) -> None:
    pub = nats_bus.publisher(source="/test")
    await pub.publish_many([health("node-a", i % 3, f"r{i}") for i in range(9)])
    await pub.publish(health("node-b", 0, "other node"))
    stored = await replay(
        nats_bus,
        name=READER,
        stream=HEALTH.name,
        subject="neuron.health.node-a.>",
        last_per_subject=True,
    )
    assert sorted(reasons(stored)) == ["r6", "r7", "r8"]


async def test_follower_catches_up_then_applies_what_comes_next(nats_bus: Bus) -> None:
    pub = nats_bus.publisher(source="/test")
    await pub.publish_many([health("node-a", 0, f"r{i}") for i in range(5)])
    applied: list[AnyEvent] = []
    follower = Follower(
        nats_bus,
        name=READER,
        stream=HEALTH.name,
        subject="neuron.health.>",
        handler=applied.append,
    )
    task = asyncio.create_task(follower.run(), name="follower")
    try:
        await asyncio.wait_for(follower.wait_caught_up(), 5)
        assert reasons(applied) == [f"r{i}" for i in range(5)]
        await pub.publish(health("node-a", 1, "later"))
        await wait_until(lambda: len(applied) == 6, what="the later event")
        assert reasons(applied)[-1] == "later"
    finally:
        follower.stop()
        await asyncio.wait_for(task, 5)


async def test_an_event_the_projection_cannot_apply_is_a_dead_letter_and_the_rest_applies(
    nats_bus: Bus,
) -> None:
    pub = nats_bus.publisher(source="/test")
    await pub.publish_many([health("node-a", i, f"r{i}") for i in range(4)])
    applied: list[str] = []

    def apply(event: AnyEvent) -> None:
        assert isinstance(event, DeviceHealthChanged)
        if event.reason == "r1":
            raise PermanentError("DeviceHealthChanged node-a/neurondevice1: reason r1 refused")
        if event.reason == "r2":
            raise RuntimeError("projection bug")
        applied.append(event.reason)

    await Follower(
        nats_bus,
        name=READER,
        stream=HEALTH.name,
        subject="neuron.health.>",
        handler=apply,
        once=True,
    ).run()
    assert applied == ["r0", "r3"]
    records = await dead_letters(nats_bus, at_least=2)
    assert [(r.kind, r.reason) for r in records] == [
        ("permanent", "DeviceHealthChanged node-a/neurondevice1: reason r1 refused"),
        ("handler", "handler raised RuntimeError('projection bug')"),
    ]


async def test_a_purged_stream_is_read_as_empty_and_what_comes_next_applies(
    nats_bus: Bus,
) -> None:
    # After a purge (or once max_age expired every message) the stream's first sequence is
    # past its last: a new reader starts there, and nothing stored is left to wait for.
    pub = nats_bus.publisher(source="/test")
    await pub.publish_many([health("node-a", i, f"old{i}") for i in range(3)])
    await nats_bus.js.purge_stream(HEALTH.name)
    stored = await asyncio.wait_for(
        replay(nats_bus, name=READER, stream=HEALTH.name, subject="neuron.health.>"), 5
    )
    assert stored == []
    applied: list[AnyEvent] = []
    follower = Follower(
        nats_bus, name=READER, stream=HEALTH.name, subject="neuron.health.>", handler=applied.append
    )
    task = asyncio.create_task(follower.run(), name="follower")
    try:
        await asyncio.wait_for(follower.wait_caught_up(), 5)
        assert applied == []
        await pub.publish(health("node-a", 1, "after the purge"))
        await wait_until(lambda: len(applied) == 1, what="the event after the purge")
        assert reasons(applied) == ["after the purge"]
    finally:
        follower.stop()
        await asyncio.wait_for(task, 5)


async def test_history_of_a_purged_stream_ends_at_once(nats_bus: Bus) -> None:
    # ``neuron-dra events`` over an audit stream whose messages all expired: nothing, not a
    # wait for a message past the purge.
    await nats_bus.publisher(source="/test").publish(health("node-a", 0, "old"))
    await nats_bus.js.purge_stream(HEALTH.name)

    async def read() -> list[StoredMessage]:
        return [s async for s in read_history(nats_bus, stream=HEALTH.name)]

    assert await asyncio.wait_for(read(), 5) == []
