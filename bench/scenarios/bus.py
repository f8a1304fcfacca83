"""``bus``: events through one publisher and one durable consumer over JetStream.

Three implementations run against the same server in the same run:
- ``neuron-dra``: the product's Publisher and ConsumerRunner (msgspec events, CloudEvents and
  trace headers, de-duplication ids, decode per message, explicit acks);
- ``nats-py``: the raw client, no framework: the same payload bytes, a msg id, fetch and ack;
- ``go``: the official Go client (``bench/go``), the client's ceiling.

Throughput is end to end: from the first publish until the consumer handled the last event,
publisher pipelined. Latency is publish-to-handle with one event in flight at a time.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import tempfile
import time
from pathlib import Path

import msgspec
import nats
import uvloop
from nats.js import api
from neuron_dra_common.bus import Bus, ConsumerSpec, Delivery, RunnerOptions
from neuron_dra_common.bus.declarations import HEALTH
from neuron_dra_common.events import AnyEvent, DeviceHealthChanged, encode

from bench.harness import CACHE_DIR, Figure, Report, nats_server, percentile

GO_DIR = Path(__file__).resolve().parents[1] / "go"


class Measured(msgspec.Struct, frozen=True, kw_only=True):
    events_per_sec: float
    p50_us: float
    p99_us: float


def _event(node: str, i: int) -> DeviceHealthChanged:
    return DeviceHealthChanged(
        node=node, device=f"neurondevice{i % 16}", health="Unhealthy", reason="ecc"
    )


async def _framework(url: str, n: int, latency_n: int) -> Measured:
    bus = await Bus.connect([url], name="bench-framework")
    await bus.reconcile(streams=[HEALTH])
    publisher = bus.publisher(source="/bench")
    options = RunnerOptions(batch=500, fetch_timeout=1.0)

    # Throughput: publisher pipelined in chunks, consumer in the same process.
    handled = 0
    all_done = asyncio.Event()

    async def count(event: AnyEvent, delivery: Delivery) -> None:
        nonlocal handled
        handled += 1
        if handled == n:
            all_done.set()

    runner = bus.runner(
        ConsumerSpec(
            stream=HEALTH.name,
            durable="bench-tput",
            filter_subjects=("neuron.health.tput.>",),
            max_ack_pending=20_000,
        ),
        count,
        options=options,
    )
    task = asyncio.create_task(runner.run(), name="bench-tput")
    events = [_event("tput", i) for i in range(n)]
    start = time.perf_counter()
    for lo in range(0, n, 1000):
        await publisher.publish_many(events[lo : lo + 1000])
    await all_done.wait()
    tput = n / (time.perf_counter() - start)
    runner.stop()
    await task

    # Latency: one event in flight.
    sent: dict[str, float] = {}
    latencies: list[float] = []
    one_done = asyncio.Event()

    async def measure(event: AnyEvent, delivery: Delivery) -> None:
        latencies.append(time.perf_counter() - sent[delivery.msg_id])
        one_done.set()

    runner = bus.runner(
        ConsumerSpec(
            stream=HEALTH.name, durable="bench-lat", filter_subjects=("neuron.health.lat.>",)
        ),
        measure,
        options=options,
    )
    task = asyncio.create_task(runner.run(), name="bench-lat")
    await asyncio.sleep(0.5)  # let the runner create its consumer and send a pull request
    for i in range(latency_n):
        one_done.clear()
        msg_id = f"lat-{i}"
        sent[msg_id] = time.perf_counter()
        await publisher.publish(_event("lat", i), msg_id=msg_id)
        await one_done.wait()
    runner.stop()
    await task
    await bus.close()
    return Measured(
        events_per_sec=tput,
        p50_us=percentile(latencies, 50) * 1e6,
        p99_us=percentile(latencies, 99) * 1e6,
    )


async def _raw(url: str, n: int, latency_n: int, payload: bytes) -> Measured:
    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(name="BENCH_RAW", subjects=["bench.raw.>"], storage=api.StorageType.FILE)

    async def consume(name: str, count: int, on_msg: object) -> None:
        sub = await js.pull_subscribe(
            f"bench.raw.{name}",
            durable=f"raw-{name}",
            config=api.ConsumerConfig(max_ack_pending=20_000),
        )
        got = 0
        while got < count:
            try:
                msgs = await sub.fetch(500, timeout=1.0)
            except TimeoutError:
                continue
            for msg in msgs:
                on_msg(msg)  # type: ignore[operator]
                await msg.ack()
                got += 1

    handled = 0

    def tally(msg: object) -> None:
        nonlocal handled
        handled += 1

    consumer = asyncio.create_task(consume("tput", n, tally))
    start = time.perf_counter()
    for lo in range(0, n, 1000):
        futures = [
            await js.publish_async("bench.raw.tput", payload, headers={"Nats-Msg-Id": f"t-{i}"})
            for i in range(lo, min(n, lo + 1000))
        ]
        await asyncio.gather(*futures)
    await consumer
    tput = n / (time.perf_counter() - start)

    latencies: list[float] = []
    sent: dict[str, float] = {}
    one = asyncio.Event()

    def measure(msg: nats.aio.msg.Msg) -> None:
        latencies.append(time.perf_counter() - sent[msg.headers["Nats-Msg-Id"]])  # type: ignore[index]
        one.set()

    consumer = asyncio.create_task(consume("lat", latency_n, measure))
    await asyncio.sleep(0.2)
    for i in range(latency_n):
        one.clear()
        sent[f"l-{i}"] = time.perf_counter()
        await js.publish("bench.raw.lat", payload, headers={"Nats-Msg-Id": f"l-{i}"})
        await one.wait()
    await consumer
    await nc.close()
    return Measured(
        events_per_sec=tput,
        p50_us=percentile(latencies, 50) * 1e6,
        p99_us=percentile(latencies, 99) * 1e6,
    )


def _go_binary() -> Path:
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    binary = CACHE_DIR / "busbench"
    subprocess.run(["go", "build", "-o", str(binary), "."], cwd=GO_DIR, check=True)
    return binary


def _go(url: str, n: int, latency_n: int, payload: bytes) -> Measured:
    binary = _go_binary()

    async def make_stream() -> None:
        nc = await nats.connect(url)
        await nc.jetstream().add_stream(
            name="BENCH_GO", subjects=["bench.go.>"], storage=api.StorageType.FILE
        )
        await nc.close()

    asyncio.run(make_stream())
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        f.write(payload)
        f.flush()
        out = subprocess.run(
            [
                str(binary),
                "-url",
                url,
                "-n",
                str(n),
                "-latency-n",
                str(latency_n),
                "-payload",
                f.name,
            ],
            check=True,
            capture_output=True,
            text=True,
            timeout=600,
        )
    data = json.loads(out.stdout.strip().splitlines()[-1])
    return Measured(
        events_per_sec=data["events_per_sec"], p50_us=data["p50_us"], p99_us=data["p99_us"]
    )


def run(*, quick: bool) -> Report:
    # Client warnings (a disconnect at close) are not part of the output.
    logging.getLogger().setLevel(logging.ERROR)
    n, latency_n = (30_000, 500) if quick else (200_000, 3_000)
    payload = encode(_event("tput", 0))
    with nats_server() as url:
        go = _go(url, n, latency_n, payload)
        raw = uvloop.run(_raw(url, n, latency_n, payload))
        ours = uvloop.run(_framework(url, n, latency_n))
    report = Report(name="bus")
    for base, label in ((raw, "nats-py"), (go, "go")):
        report.figures += [
            Figure(
                name=f"events_per_sec_vs_{label}",
                unit="events/s",
                value=ours.events_per_sec,
                baseline=base.events_per_sec,
                baseline_name=label,
            ),
            Figure(
                name=f"latency_p50_vs_{label}",
                unit="us",
                value=ours.p50_us,
                baseline=base.p50_us,
                baseline_name=label,
                higher_is_better=False,
            ),
            Figure(
                name=f"latency_p99_vs_{label}",
                unit="us",
                value=ours.p99_us,
                baseline=base.p99_us,
                baseline_name=label,
                higher_is_better=False,
            ),
        ]
    report.notes.append(
        f"{n:,} events end to end (publisher pipelined, one durable consumer), "
        f"{latency_n:,} for latency (one in flight), payload {len(payload)} bytes; "
        f"goals: >= 50,000 events/s and >= 25% of go"
    )
    return report
