"""``bus``: events through one publisher and one durable consumer over JetStream.

Three implementations run against the same server in the same run:
- ``neuron-dra``: the product's Publisher and ConsumerRunner (msgspec events, CloudEvents and
  trace headers, de-duplication ids, decode per message, explicit acks);
- ``nats-py``: the raw client, no framework: the same payload and the same headers, a msg id
  per message, ``publish_async`` in chunks, a durable pull consumer read with ``fetch``, and
  per message what a consumer of events cannot do without: decode the payload into its event
  with the product's decoder (a typed event is what a handler gets) and an awaited explicit
  ack;
- ``go``: the official Go client (``bench/go``), same payload and headers, the client's ceiling.

The goal is the raw nats-py figure: the framework uses the same client through its public
API, so what it adds (delivery metadata, de-duplication, retries, metrics, spans) should cost
no throughput. The framework's consumer is a push consumer in a deliver group, which spares
nats-py's per-message cost of ``fetch``; the raw client consuming the same way is measured
too and printed as a note, so the price of the framework itself stays in view. Both sides decode every event: a baseline that only acks bytes nobody reads
would measure a consumer no service could be.

Throughput is end to end: from the first publish until the consumer handled the last event.
The publisher and the consumer run as two processes, as two services would (the Go baseline
is one process whose goroutines use every core); the single-process figure of the framework
is printed as a note. Latency is publish-to-handle with one event in flight at a time, in one
process. Every Python process runs on uvloop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Coroutine
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import msgspec
import nats
import uvloop
from nats.aio.msg import Msg
from nats.js import api
from neuron_dra_common.bus import Bus, ConsumerRunner, ConsumerSpec, Delivery, RunnerOptions
from neuron_dra_common.bus.declarations import HEALTH
from neuron_dra_common.bus.headers import event_headers
from neuron_dra_common.driver import device_name
from neuron_dra_common.events import AnyEvent, DeviceHealthChanged, decode, encode

from bench.harness import CACHE_DIR, Figure, Report, nats_server, percentile

GO_DIR = Path(__file__).resolve().parents[1] / "go"
CHUNK = 1000  # events handed to the publisher at a time
MAX_ACK_PENDING = 20_000


class Measured(msgspec.Struct, frozen=True, kw_only=True):
    events_per_sec: float
    p50_us: float
    p99_us: float
    cpu_us_per_event: float = 0.0
    publisher_cpu_us_per_event: float = 0.0
    server_cpu_us_per_event: float = 0.0


class _Consumed(msgspec.Struct, frozen=True, kw_only=True):
    finished_at: float  # time.perf_counter(): one monotonic clock for every process
    cpu_seconds: float


def _event(node: str, i: int) -> DeviceHealthChanged:
    return DeviceHealthChanged(
        node=node, device=device_name(i % 16), health="Unhealthy", reason="ecc"
    )


def _headers(msg_id: str) -> dict[str, str]:
    """What the framework puts on the wire, for the baselines (same size, same work)."""
    return event_headers(_event("tput", 0), source="/bench", msg_id=msg_id)


def _quiet() -> None:
    # Client warnings (a disconnect at close) are not part of the output.
    logging.getLogger().setLevel(logging.ERROR)


def _tput_spec(durable: str) -> ConsumerSpec:
    return ConsumerSpec(
        stream=HEALTH.name,
        durable=durable,
        filter_subjects=("neuron.health.tput.>",),
        max_ack_pending=MAX_ACK_PENDING,
    )


async def _until_ready(runner: ConsumerRunner) -> None:
    """Wait until the runner created its consumer and asked for messages."""
    for _ in range(1000):
        if runner.ready:
            return
        await asyncio.sleep(0.01)
    raise RuntimeError(f"runner {runner.spec.durable} not ready after 10s")


# -- neuron-dra ---------------------------------------------------------------------------


async def _framework_consume(url: str, n: int, durable: str, ready: Connection) -> _Consumed:
    bus = await Bus.connect([url], name="bench-consumer")
    await bus.reconcile(streams=[HEALTH])
    handled = 0
    all_done = asyncio.Event()

    async def count(event: AnyEvent, delivery: Delivery) -> None:
        nonlocal handled
        handled += 1
        if handled == n:
            all_done.set()

    runner = bus.runner(_tput_spec(durable), count, options=RunnerOptions())
    task = asyncio.create_task(runner.run(), name="bench-tput")
    await _until_ready(runner)
    cpu = time.process_time()
    ready.send(True)
    await all_done.wait()
    result = _Consumed(finished_at=time.perf_counter(), cpu_seconds=time.process_time() - cpu)
    runner.stop()
    await task
    await bus.close()
    return result


async def _framework_publish(url: str, n: int, node: str) -> tuple[float, float]:
    """Publish ``n`` events in chunks; (start time, publisher CPU seconds)."""
    bus = await Bus.connect([url], name="bench-publisher")
    await bus.reconcile(streams=[HEALTH])
    publisher = bus.publisher(source="/bench")
    events = [_event(node, i) for i in range(n)]
    start, cpu = time.perf_counter(), time.process_time()
    for lo in range(0, n, CHUNK):
        await publisher.publish_many(events[lo : lo + CHUNK])
    cpu = time.process_time() - cpu
    await bus.close()
    return start, cpu


async def _framework_single(url: str, n: int) -> float:
    """Events/s with publisher and consumer in one process (for the note)."""
    bus = await Bus.connect([url], name="bench-single")
    await bus.reconcile(streams=[HEALTH])
    publisher = bus.publisher(source="/bench")
    handled = 0
    all_done = asyncio.Event()

    async def count(event: AnyEvent, delivery: Delivery) -> None:
        nonlocal handled
        handled += 1
        if handled == n:
            all_done.set()

    spec = ConsumerSpec(
        stream=HEALTH.name,
        durable="bench-single",
        filter_subjects=("neuron.health.single.>",),
        max_ack_pending=MAX_ACK_PENDING,
    )
    runner = bus.runner(spec, count, options=RunnerOptions())
    task = asyncio.create_task(runner.run(), name="bench-single")
    await _until_ready(runner)
    events = [_event("single", i) for i in range(n)]
    start = time.perf_counter()
    for lo in range(0, n, CHUNK):
        await publisher.publish_many(events[lo : lo + CHUNK])
    await all_done.wait()
    tput = n / (time.perf_counter() - start)
    runner.stop()
    await task
    await bus.close()
    return tput


async def _framework_latency(url: str, latency_n: int) -> list[float]:
    bus = await Bus.connect([url], name="bench-latency")
    await bus.reconcile(streams=[HEALTH])
    publisher = bus.publisher(source="/bench")
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
    )
    task = asyncio.create_task(runner.run(), name="bench-lat")
    await _until_ready(runner)
    for i in range(latency_n):
        one_done.clear()
        msg_id = f"lat-{i}"
        sent[msg_id] = time.perf_counter()
        await publisher.publish(_event("lat", i), msg_id=msg_id)
        await one_done.wait()
    runner.stop()
    await task
    await bus.close()
    return latencies


Consume = Callable[[str, int, str, Connection], Coroutine[Any, Any, _Consumed]]


def _consumer_process(consume: Consume, url: str, n: int, durable: str, conn: Connection) -> None:
    """A child process's body: run ``consume`` on uvloop, send back what it measured."""
    _quiet()
    conn.send(msgspec.json.encode(uvloop.run(consume(url, n, durable, conn))))


def _two_processes(
    url: str,
    n: int,
    consume: Consume,
    durable: str,
    publish: Callable[[str, int], Coroutine[Any, Any, tuple[float, float]]],
) -> Measured:
    """``consume`` in a child process, publisher here; figures from both."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(
        target=_consumer_process, args=(consume, url, n, durable, child), daemon=True
    )
    proc.start()

    def receive(within: float, what: str) -> bytes:
        deadline = time.monotonic() + within
        while not parent.poll(0.1):
            if not proc.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"bench consumer {durable} did not {what} (see its output)")
        return parent.recv()  # type: ignore[no-any-return]

    try:
        receive(60, "start")
        server_cpu = _server_cpu_seconds(url)
        start, pub_cpu = uvloop.run(publish(url, n))
        consumed = msgspec.json.decode(receive(600, "finish"), type=_Consumed)
        server_cpu = _server_cpu_seconds(url) - server_cpu
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    return Measured(
        events_per_sec=n / (consumed.finished_at - start),
        p50_us=0.0,
        p99_us=0.0,
        cpu_us_per_event=(pub_cpu + consumed.cpu_seconds) / n * 1e6,
        publisher_cpu_us_per_event=pub_cpu / n * 1e6,
        server_cpu_us_per_event=server_cpu / n * 1e6,
    )


def _framework(url: str, n: int, latency_n: int) -> tuple[Measured, float]:
    tput = _two_processes(
        url,
        n,
        _framework_consume,
        "bench-tput",
        lambda u, k: _framework_publish(u, k, "tput"),
    )
    latencies = uvloop.run(_framework_latency(url, latency_n))
    single = uvloop.run(_framework_single(url, n))
    return (
        msgspec.structs.replace(
            tput,
            p50_us=percentile(latencies, 50) * 1e6,
            p99_us=percentile(latencies, 99) * 1e6,
        ),
        single,
    )


# -- raw nats-py ----------------------------------------------------------------------------

_RAW_STREAM = "BENCH_RAW"


async def _raw_consume(url: str, n: int, durable: str, ready: Connection) -> _Consumed:
    nc = await nats.connect(url)
    js = nc.jetstream()
    sub = await js.pull_subscribe(
        f"bench.raw.{durable}",
        durable=durable,
        config=api.ConsumerConfig(max_ack_pending=MAX_ACK_PENDING),
    )
    cpu = time.process_time()
    ready.send(True)
    got = 0
    while got < n:
        try:
            msgs = await sub.fetch(500, timeout=1.0)
        except TimeoutError:
            continue
        for msg in msgs:
            decode(msg.data)
            await msg.ack()
            got += 1
    result = _Consumed(finished_at=time.perf_counter(), cpu_seconds=time.process_time() - cpu)
    await nc.close()
    return result


async def _raw_push_consume(url: str, n: int, durable: str, ready: Connection) -> _Consumed:
    """The raw client consuming as the framework does: pushed, in a deliver group, a callback."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    got = 0
    all_done = asyncio.Event()

    async def handle(msg: Msg) -> None:
        nonlocal got
        decode(msg.data)
        await msg.ack()
        got += 1
        if got == n:
            all_done.set()

    await js.subscribe(
        f"bench.raw.{durable}",
        queue=durable,
        durable=durable,
        cb=handle,
        manual_ack=True,
        config=api.ConsumerConfig(max_ack_pending=MAX_ACK_PENDING),
    )
    cpu = time.process_time()
    ready.send(True)
    await all_done.wait()
    result = _Consumed(finished_at=time.perf_counter(), cpu_seconds=time.process_time() - cpu)
    await nc.close()
    return result


async def _raw_publish(url: str, n: int, payload: bytes, subject: str) -> tuple[float, float]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    start, cpu = time.perf_counter(), time.process_time()
    for lo in range(0, n, CHUNK):
        futures = [
            await js.publish_async(subject, payload, headers=_headers(f"{subject}-{i}"))
            for i in range(lo, min(n, lo + CHUNK))
        ]
        await asyncio.gather(*futures)
    cpu = time.process_time() - cpu
    await nc.close()
    return start, cpu


async def _raw_latency(url: str, latency_n: int, payload: bytes) -> list[float]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    sub = await js.pull_subscribe("bench.raw.lat", durable="raw-lat")
    latencies: list[float] = []
    sent: dict[str, float] = {}
    one = asyncio.Event()

    async def consume() -> None:
        got = 0
        while got < latency_n:
            try:
                msgs = await sub.fetch(500, timeout=1.0)
            except TimeoutError:
                continue
            for msg in msgs:
                decode(msg.data)
                latencies.append(time.perf_counter() - sent[msg.headers["Nats-Msg-Id"]])  # type: ignore[index]
                await msg.ack()
                one.set()
                got += 1

    consumer = asyncio.create_task(consume(), name="raw-lat")
    await asyncio.sleep(0.2)  # let the first pull request reach the server
    for i in range(latency_n):
        one.clear()
        msg_id = f"l-{i}"
        sent[msg_id] = time.perf_counter()
        await js.publish("bench.raw.lat", payload, headers=_headers(msg_id))
        await one.wait()
    await consumer
    await nc.close()
    return latencies


def _raw(url: str, n: int, latency_n: int, payload: bytes) -> tuple[Measured, Measured]:
    """The raw client's figures with ``fetch``, and its throughput pushed (for the note)."""

    async def make_stream() -> None:
        nc = await nats.connect(url)
        await nc.jetstream().add_stream(
            name=_RAW_STREAM, subjects=["bench.raw.>"], storage=api.StorageType.FILE
        )
        await nc.close()

    uvloop.run(make_stream())
    tput = _two_processes(
        url,
        n,
        _raw_consume,
        "raw-tput",
        lambda u, k: _raw_publish(u, k, payload, "bench.raw.raw-tput"),
    )
    pushed = _two_processes(
        url,
        n,
        _raw_push_consume,
        "raw-push",
        lambda u, k: _raw_publish(u, k, payload, "bench.raw.raw-push"),
    )
    latencies = uvloop.run(_raw_latency(url, latency_n, payload))
    fetched = msgspec.structs.replace(
        tput, p50_us=percentile(latencies, 50) * 1e6, p99_us=percentile(latencies, 99) * 1e6
    )
    return fetched, pushed


# -- go -------------------------------------------------------------------------------------


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

    uvloop.run(make_stream())
    with (
        tempfile.NamedTemporaryFile(suffix=".json") as body,
        tempfile.NamedTemporaryFile(suffix=".json") as headers,
    ):
        body.write(payload)
        body.flush()
        headers.write(json.dumps(_headers("x")).encode())
        headers.flush()
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
                body.name,
                "-headers",
                headers.name,
            ],
            check=False,
            capture_output=True,
            text=True,
            timeout=600,
        )
    if out.returncode != 0:
        raise RuntimeError(f"go baseline failed ({out.returncode}): {out.stderr.strip()[-2000:]}")
    data = json.loads(out.stdout.strip().splitlines()[-1])
    return Measured(
        events_per_sec=data["events_per_sec"],
        p50_us=data["p50_us"],
        p99_us=data["p99_us"],
        cpu_us_per_event=data["cpu_us_per_event"],
    )


def _server_cpu_seconds(url: str) -> float:
    """CPU time (user + system) the NATS server listening at ``url`` used so far."""
    port = url.rsplit(":", 1)[1]
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
            if not args[0].endswith(b"nats-server") or port.encode() not in args:
                continue
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return float("nan")


async def _delete_stream(url: str, name: str) -> None:
    """Drop a finished run's stream, so the next starts on an empty store and id window."""
    nc = await nats.connect(url)
    await nc.jetstream().delete_stream(name)
    await nc.close()


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} cpus"


def run(*, quick: bool) -> Report:
    _quiet()
    n, latency_n = (30_000, 500) if quick else (200_000, 3_000)
    payload = encode(_event("tput", 0))
    load_before = _load()
    with nats_server() as url:
        server_cpu = _server_cpu_seconds(url)
        go = _go(url, n, latency_n, payload)
        # The Go process runs both measurements: its latency events are counted too.
        go = msgspec.structs.replace(
            go,
            server_cpu_us_per_event=(_server_cpu_seconds(url) - server_cpu) / n * 1e6,
        )
        uvloop.run(_delete_stream(url, "BENCH_GO"))
        raw, raw_pushed = _raw(url, n, latency_n, payload)
        uvloop.run(_delete_stream(url, _RAW_STREAM))
        ours, single = _framework(url, n, latency_n)
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
                name=f"cpu_per_event_vs_{label}",
                unit="us",
                value=ours.cpu_us_per_event,
                baseline=base.cpu_us_per_event,
                baseline_name=label,
                higher_is_better=False,
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
    report.notes += [
        f"{n:,} events end to end, publisher and durable consumer in two processes "
        f"(publish_many of {CHUNK}; every consumer decodes each event and acks it explicitly); "
        f"{latency_n:,} for latency (one "
        f"in flight, one process); payload {len(payload)} bytes with "
        f"{len(_headers('x'))} headers in every implementation",
        "cpu_per_event: CPU time of the publisher and consumer processes per event (of which "
        f"publisher: neuron-dra {ours.publisher_cpu_us_per_event:.1f} us, "
        f"nats-py {raw.publisher_cpu_us_per_event:.1f} us); the server's on top, per event: "
        f"neuron-dra {ours.server_cpu_us_per_event:.1f} us, "
        f"nats-py {raw.server_cpu_us_per_event:.1f} us, go {go.server_cpu_us_per_event:.1f} us",
        f"neuron-dra with publisher and consumer in one process: {single:,.0f} events/s",
        "nats-py consuming as neuron-dra does (push consumer in a deliver group, a callback, "
        f"decode and explicit ack): {raw_pushed.events_per_sec:,.0f} events/s, "
        f"{raw_pushed.cpu_us_per_event:.1f} us CPU per event "
        f"(neuron-dra {ours.events_per_sec / raw_pushed.events_per_sec:.2f}x of it)",
        f"{load_before} before, {_load()} after",
        "goal: events/s at least nats-py's in the same run",
    ]
    return report
