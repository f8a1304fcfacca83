"""Publishing and consuming through a real JetStream server."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from nats.js import api
from nats.js.errors import NotFoundError
from neuron_dra_common.bus import (
    Bus,
    ConsumerSpec,
    Delivery,
    Handler,
    PermanentError,
    RunnerOptions,
    consumer,
)
from neuron_dra_common.bus.declarations import HEARTBEAT, deliver_subject
from neuron_dra_common.events import AnyEvent, NodeHeartbeat
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.contracts.support import dead_letters, heartbeat, running, wait_until
from tests.fixtures.nats import NatsServer

SPEC = ConsumerSpec(stream=HEARTBEAT.name, durable="test-heartbeats", ack_wait_seconds=2.0)
FAST = RunnerOptions(backoff=(0.05,), max_attempts=3)


async def test_same_msg_id_is_stored_and_handled_once(nats_bus: Bus) -> None:
    pub = nats_bus.publisher(source="/test")
    first = await pub.publish(heartbeat(), msg_id="hb-1")
    again = await pub.publish(heartbeat(), msg_id="hb-1")
    assert (again.sequence, again.duplicate) == (first.sequence, True)

    seen: list[int] = []

    async def handle(event: AnyEvent, delivery: Delivery) -> None:
        seen.append(delivery.stream_sequence)

    async with running(nats_bus.runner(SPEC, handle, options=FAST)):
        await wait_until(lambda: len(seen) >= 1, what="first delivery")
        await pub.publish(heartbeat(sequence=2), msg_id="hb-2")
        await wait_until(lambda: len(seen) >= 2, what="second delivery")
    assert seen == [first.sequence, first.sequence + 1]


async def test_handler_failure_is_redelivered_then_acked(nats_bus: Bus) -> None:
    deliveries: list[int] = []

    async def flaky(event: AnyEvent, delivery: Delivery) -> None:
        deliveries.append(delivery.deliveries)
        if delivery.deliveries == 1:
            raise RuntimeError("apiserver unavailable")

    await nats_bus.publisher(source="/test").publish(heartbeat())
    async with running(nats_bus.runner(SPEC, flaky, options=FAST)):
        await wait_until(lambda: len(deliveries) >= 2, what="redelivery")
    info = await nats_bus.js.consumer_info(SPEC.stream, SPEC.durable)
    assert deliveries == [1, 2]
    assert (info.num_ack_pending, info.num_pending) == (0, 0)


async def test_undecodable_message_goes_to_dead_letter_with_reason(nats_bus: Bus) -> None:
    handled: list[AnyEvent] = []

    async def handle(event: AnyEvent, delivery: Delivery) -> None:
        handled.append(event)

    poison = b'{"type":"node.heartbeat.v1","node":"node-a"}'
    await nats_bus.js.publish(
        "neuron.heartbeat.node-a", poison, headers={"Nats-Msg-Id": "poison-1", "x-app": "kept"}
    )
    await nats_bus.publisher(source="/test").publish(heartbeat(node="node-b"))
    async with running(nats_bus.runner(SPEC, handle, options=FAST)):
        [record] = await dead_letters(nats_bus)
        await wait_until(lambda: len(handled) == 1, what="good message after the poison one")
    assert record.kind == "decode"
    assert "boot_id" in record.reason  # msgspec names the missing field
    assert record.payload == poison
    assert record.headers == {"Nats-Msg-Id": "poison-1", "x-app": "kept"}
    assert (record.stream, record.consumer, record.subject) == (
        HEARTBEAT.name,
        SPEC.durable,
        "neuron.heartbeat.node-a",
    )


async def test_message_that_keeps_failing_is_dead_lettered_after_max_attempts(
    nats_bus: Bus,
) -> None:
    calls = 0

    async def broken(event: AnyEvent, delivery: Delivery) -> None:
        nonlocal calls
        calls += 1
        raise ValueError("node-a: no such node")

    await nats_bus.publisher(source="/test").publish(heartbeat())
    async with running(nats_bus.runner(SPEC, broken, options=FAST)):
        [record] = await dead_letters(nats_bus)
    assert calls == 3
    assert record.kind == "handler"
    assert "no such node" in record.reason
    assert record.deliveries == 3
    assert msgspec.json.decode(record.payload, type=NodeHeartbeat).node == "node-a"
    assert record.headers["ce-type"] == "com.aws.neuron.node.heartbeat.v1"


async def test_permanent_error_skips_retries(nats_bus: Bus) -> None:
    async def refuse(event: AnyEvent, delivery: Delivery) -> None:
        raise PermanentError("NodeHeartbeat node-a: boot_id is not the node's")

    await nats_bus.publisher(source="/test").publish(heartbeat())
    async with running(nats_bus.runner(SPEC, refuse, options=FAST)):
        [record] = await dead_letters(nats_bus)
    assert (record.kind, record.deliveries) == ("permanent", 1)
    assert record.reason == "NodeHeartbeat node-a: boot_id is not the node's"


async def test_slow_handler_is_kept_alive_by_progress_acks(nats_bus: Bus) -> None:
    spec = msgspec.structs.replace(SPEC, ack_wait_seconds=1.0)
    deliveries: list[int] = []

    async def slow(event: AnyEvent, delivery: Delivery) -> None:
        deliveries.append(delivery.deliveries)
        await asyncio.sleep(2.5)

    options = msgspec.structs.replace(FAST, progress_interval=0.25)
    await nats_bus.publisher(source="/test").publish(heartbeat())
    async with running(nats_bus.runner(spec, slow, options=options)):
        await wait_until(lambda: len(deliveries) == 1, what="delivery")
        await asyncio.sleep(3.0)
    assert deliveries == [1]


async def test_handler_timeout_counts_as_failure(nats_bus: Bus) -> None:
    deliveries: list[int] = []

    async def stuck(event: AnyEvent, delivery: Delivery) -> None:
        deliveries.append(delivery.deliveries)
        await asyncio.sleep(60)

    options = msgspec.structs.replace(FAST, handler_timeout=0.2, max_attempts=2)
    await nats_bus.publisher(source="/test").publish(heartbeat())
    async with running(nats_bus.runner(SPEC, stuck, options=options)):
        [record] = await dead_letters(nats_bus)
    assert deliveries == [1, 2]
    assert "timed out after 0.2s" in record.reason


async def test_one_trace_from_publisher_to_handler(nats_bus: Bus) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    handler_trace: list[int] = []

    async def handle(event: AnyEvent, delivery: Delivery) -> None:
        handler_trace.append(trace.get_current_span().get_span_context().trace_id)

    traced = Bus(nats_bus.nc, tracer_provider=provider)
    with tracer.start_as_current_span("node boots") as root:
        await traced.publisher(source="/test").publish(heartbeat())
    async with running(traced.runner(SPEC, handle, options=FAST)):
        await wait_until(lambda: len(handler_trace) == 1, what="handled")
    trace_id = root.get_span_context().trace_id
    assert handler_trace == [trace_id]
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert spans["publish node.heartbeat.v1"].context.trace_id == trace_id
    consumer_span = spans["process node.heartbeat.v1"]
    assert consumer_span.context.trace_id == trace_id
    assert consumer_span.parent is not None
    assert consumer_span.parent.span_id == spans["publish node.heartbeat.v1"].context.span_id


@pytest.mark.parametrize("durable", ["slice-publisher-inventory", "audit"])
async def test_declared_consumers_reconcile_idempotently(nats_bus: Bus, durable: str) -> None:
    spec = consumer(durable)
    assert (await nats_bus.reconcile(consumers=[spec]))[f"{spec.stream}/{durable}"] == "created"
    again = await nats_bus.reconcile(consumers=[spec])
    assert set(again.values()) == {"unchanged"}
    changed = msgspec.structs.replace(spec, ack_wait_seconds=45.0)
    assert (await nats_bus.reconcile(streams=(), consumers=[changed])) == {
        f"{spec.stream}/{durable}": "updated"
    }
    info = await nats_bus.js.consumer_info(spec.stream, durable)
    assert info.config.ack_wait == 45.0
    names = [c.name for c in await nats_bus.js.consumers_info(spec.stream)]
    assert names == [durable]


async def test_an_earlier_releases_pull_consumer_is_replaced_from_its_ack_floor(
    nats_bus: Bus,
) -> None:
    """A pull consumer of the same name (release 0.1.0 made them) becomes a push consumer that
    starts after what the old one acknowledged: nothing acknowledged comes again, nothing
    unacknowledged is skipped."""
    js = nats_bus.js
    await js.add_consumer(
        SPEC.stream,
        api.ConsumerConfig(
            durable_name=SPEC.durable,
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=SPEC.ack_wait_seconds,
            max_ack_pending=SPEC.max_ack_pending,
        ),
    )
    pub = nats_bus.publisher(source="/test")
    # One node each: the heartbeat stream keeps the latest per node.
    sent = [(await pub.publish(heartbeat(f"node-{i}"))).sequence for i in range(1, 6)]
    old = await js.pull_subscribe_bind(durable=SPEC.durable, stream=SPEC.stream)
    for msg in await old.fetch(3, timeout=5):
        await msg.ack_sync()
    await old.unsubscribe()

    seen: list[int] = []

    async def handle(event: AnyEvent, delivery: Delivery) -> None:
        seen.append(delivery.stream_sequence)

    async with running(nats_bus.runner(SPEC, handle, options=FAST)):
        await wait_until(lambda: len(seen) >= 2, what="the unacknowledged two")
        await asyncio.sleep(0.3)
    assert seen == sent[3:]
    info = await js.consumer_info(SPEC.stream, SPEC.durable)
    assert (info.config.deliver_subject, info.config.deliver_group) == (
        deliver_subject(SPEC),
        SPEC.durable,
    )
    assert info.num_ack_pending == 0
    assert await nats_bus.reconcile(streams=(), consumers=[SPEC]) == {
        f"{SPEC.stream}/{SPEC.durable}": "unchanged"
    }
    # Its other settings can still change; where it started stays.
    longer = msgspec.structs.replace(SPEC, ack_wait_seconds=9.0)
    assert await nats_bus.reconcile(streams=(), consumers=[longer]) == {
        f"{SPEC.stream}/{SPEC.durable}": "updated"
    }
    info = await js.consumer_info(SPEC.stream, SPEC.durable)
    assert (info.config.ack_wait, info.config.opt_start_seq) == (9.0, sent[3])


async def test_a_consumer_deleted_under_its_runner_is_created_again(nats_bus: Bus) -> None:
    seen: list[int] = []

    async def handle(event: AnyEvent, delivery: Delivery) -> None:
        seen.append(delivery.stream_sequence)

    pub = nats_bus.publisher(source="/test")
    options = msgspec.structs.replace(FAST, progress_interval=0.2)
    async with running(nats_bus.runner(SPEC, handle, options=options)):
        first = (await pub.publish(heartbeat("node-1"))).sequence
        await wait_until(lambda: seen == [first], what="the first event")
        await nats_bus.js.delete_consumer(SPEC.stream, SPEC.durable)

        async def exists() -> bool:
            try:
                await nats_bus.js.consumer_info(SPEC.stream, SPEC.durable)
            except NotFoundError:
                return False
            return True

        for _ in range(50):
            if await exists():
                break
            await asyncio.sleep(0.1)
        assert await exists(), "the runner did not create its consumer again"
        second = (await pub.publish(heartbeat("node-2"))).sequence
        await wait_until(lambda: second in seen, what="the event after the consumer came back")
        await asyncio.sleep(0.3)
    # The new consumer starts at the stream's beginning: the first event came again and was
    # acked without its handler (the runner remembers what it handled).
    assert seen == [first, second]


async def test_instances_of_one_service_share_its_consumer_and_none_is_handled_twice(
    nats_bus: Bus, nats_server: NatsServer
) -> None:
    other = await Bus.connect([nats_server.url], name="second-instance")
    handled: dict[str, list[int]] = {"one": [], "two": []}

    def handler(instance: str) -> Handler:
        async def handle(event: AnyEvent, delivery: Delivery) -> None:
            handled[instance].append(delivery.stream_sequence)

        return handle

    pub = nats_bus.publisher(source="/test")
    try:
        async with (
            running(nats_bus.runner(SPEC, handler("one"), options=FAST)),
            running(other.runner(SPEC, handler("two"), options=FAST)),
        ):
            await pub.publish_many([heartbeat(f"node-{i}") for i in range(1, 101)])
            await wait_until(
                lambda: len(handled["one"]) + len(handled["two"]) >= 100, what="100 events"
            )
            await asyncio.sleep(0.3)
    finally:
        await other.close()
    everything = handled["one"] + handled["two"]
    assert len(everything) == len(set(everything)) == 100
    assert handled["one"], "the second instance got every event"
    assert handled["two"], "the first instance got every event"
