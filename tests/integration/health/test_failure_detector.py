"""The failure detector as a process against a real nats-server: a silent node is declared
lost within seconds; restarting NATS or the detector (kill -9) declares nobody lost, and a
node lost before the restart is neither declared again nor taken back without heartbeats."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from neuron_dra_common.bus import Bus, PublishError, replay
from neuron_dra_common.bus.declarations import HEALTH
from neuron_dra_common.events import AnyEvent, NodeHeartbeat, NodeLost, NodeRecovered

from tests.fixtures.nats import NatsServer

NODES = [f"node-{i}" for i in range(5)]


class Nodes:
    """Heartbeats every second from the nodes that are ``up``, as discovery sends them."""

    def __init__(self, bus: Bus) -> None:
        self.publisher = bus.publisher(source="/test/discovery")
        self.up = set(NODES)
        self.seq = 0

    async def run(self) -> None:
        while True:
            self.seq += 1
            for node in sorted(self.up):
                beat = NodeHeartbeat(
                    node=node,
                    boot_id="boot",
                    sequence=self.seq,
                    sent_at=datetime.now(UTC),
                    interval_seconds=1.0,
                )
                with contextlib.suppress(PublishError, TimeoutError):
                    await self.publisher.publish(beat, msg_id=f"hb-{node}-{self.seq}")
            await asyncio.sleep(1.0)


def start_detector(nats: NatsServer, log: Path, **extra: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        **nats.open_env,
        "NEURON_DRA_KUBERNETES": "false",
        "NEURON_DRA_HTTP_HOST": "127.0.0.1",
        "NEURON_DRA_HTTP_PORT": "0",
        **extra,
    }
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "neuron_dra_health_monitor"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


async def started(log: Path, *, count: int = 1) -> None:
    """Wait until the detector wrote ``count`` times that it is ready (imports are slow on
    a busy machine), then one more window for it to hear everybody."""
    deadline = time.monotonic() + 120
    while (text := await asyncio.to_thread(log.read_text)).count("failure detector ready") < count:
        assert time.monotonic() < deadline, text[-3000:]
        await asyncio.sleep(0.2)
    await asyncio.sleep(4)


async def node_events(bus: Bus) -> list[AnyEvent]:
    return await replay(bus, name="test-reader", stream=HEALTH.name, subject="neuron.health.*.node")


async def wait_for_event(
    bus: Bus, kind: type[NodeLost | NodeRecovered], node: str, *, within: float
) -> float:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = await node_events(bus)
        if any(isinstance(e, kind) and e.node == node for e in found):
            return time.monotonic()
        await asyncio.sleep(0.2)
    raise AssertionError(f"no {kind.__name__} for {node} within {within} s")


@pytest.fixture
async def beating(nats_bus: Bus) -> AsyncIterator[Nodes]:
    nodes = Nodes(nats_bus)
    task = asyncio.create_task(nodes.run())
    try:
        yield nodes
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_restarts_of_nats_and_the_detector_declare_nobody_lost(
    nats_server: NatsServer, nats_bus: Bus, beating: Nodes, tmp_path: Path
) -> None:
    log = tmp_path / "detector.log"
    detector = start_detector(nats_server, log)
    try:
        await started(log)
        assert await node_events(nats_bus) == [], log.read_text()

        beating.up.discard("node-4")
        stopped = time.monotonic()
        declared = await wait_for_event(nats_bus, NodeLost, "node-4", within=20)
        print(f"heartbeats stopped -> NodeLost: {declared - stopped:.1f} s")

        # NATS restarts (down for 3 s, longer than a window): nobody else is lost.
        await nats_server.restart_async(down_for=3.0)
        await asyncio.sleep(10)
        # The detector is killed, not stopped, and started again.
        detector.send_signal(signal.SIGKILL)
        detector.wait(timeout=10)
        detector = start_detector(nats_server, log)
        await started(log, count=2)
        await asyncio.sleep(6)

        events = await node_events(nats_bus)
        assert [(type(e).__name__, getattr(e, "node", "")) for e in events] == [
            ("NodeLost", "node-4")
        ], log.read_text()[-3000:]

        # Back: recovered after a few heartbeats, once.
        beating.up.add("node-4")
        await wait_for_event(nats_bus, NodeRecovered, "node-4", within=20)
        events = await node_events(nats_bus)
        assert [type(e).__name__ for e in events] == ["NodeLost", "NodeRecovered"]
    finally:
        detector.send_signal(signal.SIGTERM)
        code = detector.wait(timeout=30)
    assert code == 0, log.read_text()[-3000:]
