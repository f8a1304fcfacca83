"""Heartbeats at 10,000 nodes: today's way (every beat a NodeHeartbeat the failure detector
consumes) against the bus keeping them (``ttl`` mode: alive beats with a Nats-TTL, which the
detector polls once a second), both in the same run.

For each mode: a fresh three-server NATS cluster as the eks overlay configures it (streams R3),
a simulator process playing ``nodes`` node agents beating once a second, and the product's
failure detector (``neuron-dra-failure-detector``, without Kubernetes) as its own process.
After a warm-up, the detector's and the servers' CPU are read over a steady window, and the
messages the servers sent to the detector's connection (``/connz``, out_msgs: its consumer's
deliveries and acks' replies, or the poll's answers). Then ``SILENCED`` nodes stop beating
without a goodbye; silent -> NodeLost is the NodeLost's ``detected_at`` less each node's last
beat sent.

The simulator publishes the agents' messages as they are on the wire (the NodeHeartbeat with
its CloudEvents headers and message id; the alive beat's headers and no body) without waiting
for each ack: it plays the fleet, it is not what is measured.

    python -m bench heartbeats
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from neuron_dra_common.bus import Bus, alive_subject, replay
from neuron_dra_common.bus.declarations import HEALTH
from neuron_dra_common.events import NodeHeartbeat, NodeLost, encode
from neuron_dra_common.liveness import alive_ttl

from bench.harness import Figure, Report, cpu_seconds, cpu_used, percentile
from bench.natscluster import NatsCluster, nats_cluster

__all__ = ["run"]

Mode = Literal["stream", "ttl"]
NODES = 10_000
SILENCED = 20
INTERVAL = 1.0
DETECTOR = "failure-detector"


def node_name(i: int) -> str:
    return f"ip-10-{i // 62500}-{i // 250 % 250}-{i % 250}.ec2.internal"


# --- the simulator (a child process) ------------------------------------------------------


async def simulate(urls: list[str], nodes: int, mode: Mode, seconds: float, out: Path) -> None:
    """Beat for ``nodes`` nodes until the file ``out``.stop exists (at most ``seconds``); the
    first ``SILENCED`` stop once ``out``.silence exists; write when each sent its last beat
    to ``out``."""
    import nats
    from neuron_dra_common.bus.headers import event_headers

    nc = await nats.connect(urls, name="simulator", pending_size=64 * 1024 * 1024)
    names = [node_name(i) for i in range(nodes)]
    instance = "sim000000001"
    ttl = alive_ttl(INTERVAL)
    silence, stop = Path(f"{out}.silence"), Path(f"{out}.stop")
    last: dict[str, float] = {}
    sequence = 0

    async def hello_or_beat(name: str) -> None:
        beat = NodeHeartbeat(
            node=name,
            boot_id="b" * 36,
            sequence=sequence,
            sent_at=datetime.now(UTC),
            interval_seconds=INTERVAL,
            instance=instance,
            alive_ttl_seconds=float(ttl) if mode == "ttl" else 0.0,
        )
        msg_id = f"heartbeat/{name}/{instance}/{sequence}"
        headers = event_headers(beat, source=f"/neuron-dra/discovery/{name}", msg_id=msg_id)
        await nc.publish(beat.subject, encode(beat), headers=headers)

    async def alive(name: str) -> None:
        headers = {
            "Nats-TTL": f"{ttl}s",
            "Neuron-Seq": str(sequence),
            "Neuron-Instance": instance,
            "Neuron-Boot": "b" * 36,
        }
        await nc.publish(alive_subject(name), b"", headers=headers)

    if mode == "ttl":
        sequence = 1
        for name in names:
            await hello_or_beat(name)
        await nc.flush()
    end = time.monotonic() + seconds
    while time.monotonic() < end and not await asyncio.to_thread(stop.exists):
        sequence += 1
        start = time.monotonic()
        quiet = await asyncio.to_thread(silence.exists)
        for j, name in enumerate(names):
            if quiet and j < SILENCED:
                continue
            await (alive(name) if mode == "ttl" else hello_or_beat(name))
            if j < SILENCED:
                last[name] = time.time()
            if j % 200 == 199:  # spread over 0.9 of the interval
                await asyncio.sleep(max(0.0, start + 0.9 * j / len(names) - time.monotonic()))
        await nc.flush()
        await asyncio.sleep(max(0.0, start + INTERVAL - time.monotonic()))
    await asyncio.to_thread(out.write_text, json.dumps(last))
    await nc.close()


# --- the run ------------------------------------------------------------------------------


def _out_msgs(cluster: NatsCluster, name: str) -> int:
    """Messages the servers sent to the connections named ``name``."""
    total = 0
    for server in cluster.servers:
        url = f"http://127.0.0.1:{server.monitor}/connz?limit=1024"
        with urllib.request.urlopen(url, timeout=5) as answer:
            for conn in json.loads(answer.read()).get("connections") or []:
                if conn.get("name") == name:
                    total += int(conn.get("out_msgs") or 0)
    return total


async def _lost(urls: list[str]) -> dict[str, float]:
    bus = await Bus.connect(urls, name="bench-reader")
    try:
        events = await replay(
            bus, name="bench-reader", stream=HEALTH.name, subject="neuron.health.*.node"
        )
    finally:
        await bus.close()
    return {e.node: e.detected_at.timestamp() for e in events if isinstance(e, NodeLost)}


async def _declare(urls: list[str]) -> None:
    bus = await Bus.connect(urls, name="bench-admin")
    try:
        await bus.reconcile(replicas=3)
    finally:
        await bus.close()


def _wait_for(log: Path, text: str, within: float) -> None:
    deadline = time.monotonic() + within
    while text not in log.read_text(errors="replace"):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{log}: no {text!r} within {within:.0f} s")
        time.sleep(0.5)


def one_mode(mode: Mode, *, nodes: int, warm: float, window: float, root: Path) -> dict[str, float]:
    """One mode on a fresh cluster: the figures of the module's docstring (CPU in
    millicores)."""
    root.mkdir(parents=True)
    with nats_cluster(root) as cluster:
        asyncio.run(_declare(cluster.urls))
        out = root / "last-beats.json"
        total = 600.0
        sim = subprocess.Popen(
            [
                *(sys.executable, "-m", "bench.scenarios.heartbeats", "simulate", mode),
                *(str(nodes), str(total), str(out), *cluster.urls),
            ],
        )
        time.sleep(5)  # the fleet's first beats (and hellos) stored
        log = root / "detector.log"
        env = {
            **os.environ,
            "NEURON_DRA_NATS_SERVERS": ",".join(cluster.urls),
            "NEURON_DRA_INSECURE_BUS": "1",
            "NEURON_DRA_KUBERNETES": "false",
            "NEURON_DRA_STREAM_REPLICAS": "3",
            "NEURON_DRA_HTTP_HOST": "127.0.0.1",
            "NEURON_DRA_HTTP_PORT": "0",
        }
        with log.open("wb") as sink:
            detector = subprocess.Popen(
                [sys.executable, "-m", "neuron_dra_health_monitor"],
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        try:
            _wait_for(log, "failure detector ready", 120)
            time.sleep(warm)
            pids = {"detector": detector.pid, **cluster.pids}
            cpu0, msgs0, t0 = cpu_seconds(pids), _out_msgs(cluster, DETECTOR), time.monotonic()
            time.sleep(window)
            cpu1, msgs1, t1 = cpu_seconds(pids), _out_msgs(cluster, DETECTOR), time.monotonic()
            Path(f"{out}.silence").touch()
            time.sleep(15)
            lost = asyncio.run(_lost(cluster.urls))
        finally:
            detector.terminate()
            detector.wait(timeout=30)
            Path(f"{out}.stop").touch()
        sim.wait(timeout=60)
        last = json.loads(out.read_text())
    used = cpu_used(cpu0, cpu1)
    seconds = t1 - t0
    silent = [lost[n] - at for n, at in last.items() if n in lost]
    wrongly = sorted(set(lost) - set(last))
    return {
        "detector_cpu": 1000 * used["detector"] / seconds,
        "server_cpu": 1000 * sum(v for k, v in used.items() if k != "detector") / seconds,
        "delivered_per_s": (msgs1 - msgs0) / seconds,
        "lost_p50": percentile(silent, 50) if silent else float("nan"),
        "lost_p99": percentile(silent, 99) if silent else float("nan"),
        "found": float(len(silent)),
        "wrongly_lost": float(len(wrongly)),
    }


def run(*, quick: bool = False, nodes: int = NODES) -> Report:
    if quick:
        nodes = min(nodes, 200)
    warm, window = (5.0, 10.0) if quick else (10.0, 30.0)
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-heartbeats-") as tmp:
        for mode in ("stream", "ttl"):
            results[mode] = one_mode(
                mode, nodes=nodes, warm=warm, window=window, root=Path(tmp) / mode
            )
    today, new = results["stream"], results["ttl"]
    report = Report(name=f"heartbeats ({nodes:,} nodes, 3 servers R3)")
    for key, name, unit in (
        ("detector_cpu", "detector CPU", "millicores"),
        ("delivered_per_s", "messages to the detector", "msg/s"),
        ("server_cpu", "server CPU (3 servers)", "millicores"),
        ("lost_p50", "silent -> NodeLost p50", "s"),
        ("lost_p99", "silent -> NodeLost p99", "s"),
    ):
        report.figures.append(
            Figure(
                name=name,
                unit=unit,
                value=new[key],
                baseline=today[key],
                baseline_name="stream mode",
                higher_is_better=False,
            )
        )
    report.notes.append(
        f"ttl mode: {new['found']:.0f}/{SILENCED} silenced nodes found, "
        f"{new['wrongly_lost']:.0f} beating nodes declared lost; stream mode: "
        f"{today['found']:.0f}/{SILENCED}, {today['wrongly_lost']:.0f}"
    )
    return report


def main(argv: list[str]) -> int:
    if argv[:1] == ["simulate"]:
        mode, nodes, seconds, out, *urls = argv[1:]
        assert mode in ("stream", "ttl"), mode
        asyncio.run(simulate(urls, int(nodes), mode, float(seconds), Path(out)))  # type: ignore[arg-type]
        return 0
    print(f"usage: python -m bench heartbeats [--quick]; not {argv}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
