"""The bus's busy path: headers on the wire, windowed publishes, acks among failures, timeouts."""

from __future__ import annotations

import asyncio
from collections import Counter

import msgspec
from nats.aio.msg import Msg
from neuron_dra_common.bus import Bus, ConsumerSpec, Delivery, RunnerOptions
from neuron_dra_common.bus.declarations import HEALTH
from neuron_dra_common.bus.publisher import Publisher
from neuron_dra_common.events import AnyEvent, DeviceHealthChanged
from neuron_dra_common.telemetry import REGISTRY
from opentelemetry.sdk.trace import TracerProvider

from tests.contracts.support import dead_letters, heartbeat, running, wait_until

SPEC = ConsumerSpec(stream=HEALTH.name, durable="test-hot-path", ack_wait_seconds=2.0)
FAST = RunnerOptions(backoff=(0.05,), max_attempts=3)


def health(i: int) -> DeviceHealthChanged:
    """The ``i``-th event of a run (its number in ``reason``); each is kept by the stream."""
    return DeviceHealthChanged(
        node="node-a", device=f"neurondevice{i % 16}", health="Unhealthy", reason=str(i)
    )


def number(event: AnyEvent) -> int:
    assert isinstance(event, DeviceHealthChanged)
    return int(event.reason)


async def test_every_event_carries_its_headers_on_the_wire(nats_bus: Bus) -> None:
    seen: list[Msg] = []

    async def watch(msg: Msg) -> None:
        seen.append(msg)

    # A plain nats-py subscription reads what any other client would.
    await nats_bus.nc.subscribe("neuron.heartbeat.>", cb=watch)
    provider = TracerProvider()
    traced = Bus(nats_bus.nc, tracer_provider=provider)
    pub = traced.publisher(source="/test/wire")
    with provider.get_tracer("test").start_as_current_span("boot") as root:
        results = await pub.publish_many([heartbeat(sequence=i) for i in range(3)])
    await wait_until(lambda: len(seen) == 3, what="three messages")
    trace_id = f"{root.get_span_context().trace_id:032x}"
    for msg, result in zip(seen, results, strict=True):
        h = msg.headers or {}
        assert h["Nats-Msg-Id"] == h["ce-id"] == result.msg_id
        assert h["ce-source"] == "/test/wire"
        assert h["ce-type"] == "com.aws.neuron.node.heartbeat.v1"
        assert h["ce-specversion"] == "1.0"
        assert h["ce-subject"] == "nodes/node-a"
        assert h["ce-time"].endswith("+00:00")
        assert h["traceparent"].split("-")[1] == trace_id
    assert len({r.msg_id for r in results}) == 3


async def test_no_traceparent_without_a_trace(nats_bus: Bus) -> None:
    seen: list[Msg] = []

    async def watch(msg: Msg) -> None:
        seen.append(msg)

    await nats_bus.nc.subscribe("neuron.heartbeat.>", cb=watch)
    await nats_bus.publisher(source="/test").publish(heartbeat())
    await wait_until(lambda: len(seen) == 1, what="the message")
    assert "traceparent" not in (seen[0].headers or {})


async def test_publish_many_beyond_one_window_stores_each_once_in_order(nats_bus: Bus) -> None:
    pub = Publisher(nats_bus.js, source="/test", window=100)
    events = [health(i) for i in range(1050)]
    ids = [f"hb-{i}" for i in range(1050)]
    first = await pub.publish_many(events, msg_ids=ids)
    again = await pub.publish_many(events[:150], msg_ids=ids[:150])
    assert [r.msg_id for r in first] == ids
    sequences = [r.sequence for r in first]
    assert sequences == sorted(sequences)
    assert len(set(sequences)) == 1050
    assert all(r.duplicate for r in again)
    assert [r.sequence for r in again] == sequences[:150]
    info = await nats_bus.js.stream_info(HEALTH.name)
    assert info.state.messages == 1050


async def test_a_failed_handler_is_never_acked_with_the_others(nats_bus: Bus) -> None:
    # Among many acks in flight, those of failed handlers must never be sent.
    total = 300
    attempts: Counter[str] = Counter()
    succeeded: Counter[str] = Counter()

    async def every_third_fails_once(event: AnyEvent, delivery: Delivery) -> None:
        attempts[delivery.msg_id] += 1
        if number(event) % 3 == 0 and delivery.deliveries == 1:
            raise RuntimeError(f"first try of {delivery.msg_id}")
        succeeded[delivery.msg_id] += 1

    await nats_bus.publisher(source="/test").publish_many(
        [health(i) for i in range(total)], msg_ids=[f"m-{i}" for i in range(total)]
    )
    async with running(nats_bus.runner(SPEC, every_third_fails_once, options=FAST)):
        await wait_until(lambda: len(succeeded) == total, what="all handled")
        await asyncio.sleep(2.5)  # anything left unacked comes back after ack_wait (2s)
        info = await nats_bus.js.consumer_info(SPEC.stream, SPEC.durable)
    assert set(succeeded.values()) == {1}
    failing = {f"m-{i}" for i in range(0, total, 3)}
    assert {k for k, n in attempts.items() if n == 2} == failing
    assert {k for k, n in attempts.items() if n == 1} == set(succeeded) - failing
    assert info.num_ack_pending == 0
    assert info.num_redelivered == 0  # nothing outstanding is being redelivered


async def test_handler_timeout_among_fast_handlers(nats_bus: Bus) -> None:
    # One watchdog serves every handler call: it must time out the stuck one, re-arm for
    # later ones, and leave fast ones alone.
    handled: list[int] = []
    stuck_deliveries: list[int] = []

    async def handle(event: AnyEvent, delivery: Delivery) -> None:
        if number(event) == 20:
            stuck_deliveries.append(delivery.deliveries)
            await asyncio.sleep(60)
        await asyncio.sleep(0.01)
        handled.append(number(event))

    options = msgspec.structs.replace(FAST, handler_timeout=0.3, max_attempts=2)
    await nats_bus.publisher(source="/test").publish_many([health(i) for i in range(60)])
    async with running(nats_bus.runner(SPEC, handle, options=options)) as runner:
        [record] = await dead_letters(nats_bus)
        await wait_until(lambda: len(handled) == 59, what="the others handled")
        assert runner.ready
    assert stuck_deliveries == [1, 2]
    assert "timed out after 0.3s" in record.reason
    assert sorted(handled) == [i for i in range(60) if i != 20]


async def test_stopping_during_a_handler_hands_the_message_back(nats_bus: Bus) -> None:
    started = asyncio.Event()
    deliveries: list[int] = []

    async def slow(event: AnyEvent, delivery: Delivery) -> None:
        deliveries.append(delivery.deliveries)
        started.set()
        await asyncio.sleep(60)

    await nats_bus.publisher(source="/test").publish(health(0))
    runner = nats_bus.runner(SPEC, slow, options=FAST)
    task = asyncio.create_task(runner.run(), name="runner-cancelled")
    await asyncio.wait_for(started.wait(), 10)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    else:
        raise AssertionError("the runner swallowed its cancellation")
    again: list[int] = []

    async def record(event: AnyEvent, delivery: Delivery) -> None:
        again.append(delivery.deliveries)

    async with running(nats_bus.runner(SPEC, record, options=FAST)):
        # Nak'd at once, so it is back well before the 2s ack wait.
        await wait_until(lambda: again == [2], within=1.5, what="redelivery after the nak")


async def test_handler_times_reach_the_histogram_while_running(nats_bus: Bus) -> None:
    # Every handler call is timed, failures included.
    spec = ConsumerSpec(stream=HEALTH.name, durable="test-hot-path-times", ack_wait_seconds=2.0)

    def observed(consumer: str) -> float:
        value = REGISTRY.get_sample_value(
            "neuron_dra_bus_handle_seconds_count", {"consumer": consumer}
        )
        return value or 0.0

    async def always_fails(event: AnyEvent, delivery: Delivery) -> None:
        raise RuntimeError("not yet")

    options = msgspec.structs.replace(FAST, max_attempts=100, backoff=(5.0,))
    await nats_bus.publisher(source="/test").publish_many([health(i) for i in range(3)])
    async with running(nats_bus.runner(spec, always_fails, options=options)):
        await wait_until(lambda: observed(spec.durable) >= 3, what="three handler times")
