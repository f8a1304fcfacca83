"""Heartbeats the bus keeps (``ttl`` mode), against real nats-servers and the failure detector
as a process: agents say hello on NEURON_HEARTBEAT and beat on NEURON_ALIVE with a Nats-TTL;
the detector asks the stream once a second who is still there.

What a user sees: a silent node's NodeLost within its TTL, one poll and half a second of its
last beat, and the detector's consumer handed only the hellos; a goodbye buys the restart
grace; a server restart, or a kill -9 of the stream's leader in a 3-server R3 cluster,
declares nobody lost; old agents (every beat a NodeHeartbeat) and new ones judged side by side.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import AsyncIterator, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import nats.errors
import pytest
from neuron_dra_common.bus import AlivePublisher, Bus
from neuron_dra_common.bus.declarations import ALIVE, HEARTBEAT
from neuron_dra_common.events import AnyEvent, NodeLost, NodeRecovered
from neuron_dra_common.liveness import Heartbeat
from neuron_dra_health_monitor.detector_service import DURABLE

from tests.fixtures.nats import NatsCluster, NatsServer
from tests.integration.health.test_failure_detector import (
    node_events,
    start_detector,
    started,
    wait_for_event,
)

#: The agent's TTL (3 x 1 s), the detector's poll, and the slack the test allows.
TTL, POLL, SLACK = 3.0, 1.0, 0.5


class Fleet:
    """Node agents beating every second with the product's ``Heartbeat``, each in its mode;
    ``silence`` stops one without a goodbye (as a node losing power)."""

    def __init__(self, bus: Bus, modes: dict[str, Literal["stream", "ttl"]]) -> None:
        self.bus = bus
        self.beats = {node: self._agent(node, mode) for node, mode in modes.items()}
        self.up = set(modes)
        #: wall time of each node's last beat the bus acknowledged
        self.last_beat: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None

    def _agent(self, node: str, mode: Literal["stream", "ttl"]) -> Heartbeat:
        return Heartbeat(
            publisher=self.bus.publisher(source=f"/test/discovery/{node}"),
            node=node,
            boot_id="boot",
            interval=1.0,
            mode=mode,
            alive=AlivePublisher(self.bus.js, node=node),
        )

    def restart(self, node: str, mode: Literal["stream", "ttl"] = "ttl") -> None:
        """A new agent process on ``node`` (its own instance, numbering from 1)."""
        self.beats[node] = self._agent(node, mode)
        self.up.add(node)

    async def _beat(self, node: str) -> None:
        if await self.beats[node].beat():
            self.last_beat[node] = time.time()

    async def _run(self) -> None:
        while True:
            await asyncio.gather(*(self._beat(n) for n in sorted(self.up)))
            await asyncio.sleep(1.0)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


@contextlib.asynccontextmanager
async def fleet(bus: Bus, modes: dict[str, Literal["stream", "ttl"]]) -> AsyncIterator[Fleet]:
    nodes = Fleet(bus, modes)
    nodes.start()
    try:
        yield nodes
    finally:
        await nodes.stop()


@contextlib.asynccontextmanager
async def detector(
    env: NatsServer | NatsCluster, log: Path, **extra: str
) -> AsyncIterator[subprocess.Popen[bytes]]:
    proc = start_detector(env, log, **extra)  # type: ignore[arg-type]
    try:
        await started(log)
        yield proc
    finally:
        proc.terminate()
        code = proc.wait(timeout=30)
        assert code == 0, (await asyncio.to_thread(log.read_text))[-3000:]


def ttl_nodes(names: Iterable[str]) -> dict[str, Literal["stream", "ttl"]]:
    return dict.fromkeys(names, "ttl")


def declared(events: Iterable[object]) -> list[tuple[str, str]]:
    return [(type(e).__name__, str(getattr(e, "node", ""))) for e in events]


async def test_a_silent_node_is_lost_within_its_ttl_and_a_poll_and_recovers(
    nats_server: NatsServer, nats_bus: Bus, tmp_path: Path
) -> None:
    log = tmp_path / "detector.log"
    async with (
        fleet(nats_bus, ttl_nodes(f"node-{i}" for i in range(5))) as nodes,
        detector(nats_server, log),
    ):
        await asyncio.sleep(3)
        assert await node_events(nats_bus) == [], log.read_text()[-3000:]
        nodes.up.discard("node-4")
        lost = await wait_for_event(nats_bus, NodeLost, "node-4", within=15)
        [event] = [e for e in await node_events(nats_bus) if isinstance(e, NodeLost)]
        assert isinstance(event, NodeLost)
        after = event.detected_at.timestamp() - nodes.last_beat["node-4"]
        print(f"last beat -> NodeLost: {after:.2f} s (bound {TTL + POLL + SLACK} s)")
        assert after <= TTL + POLL + SLACK, event
        assert event.reason.startswith("no heartbeat for "), event.reason
        assert event.reason.endswith("(every 1 s expected)"), event.reason
        assert event.last_heartbeat_at is not None

        # Its beats again: recovered after three in a row (read back from the stream).
        nodes.up.add("node-4")
        await wait_for_event(nats_bus, NodeRecovered, "node-4", within=15)
        assert lost > 0
        assert declared(await node_events(nats_bus)) == [
            ("NodeLost", "node-4"),
            ("NodeRecovered", "node-4"),
        ]
        # The detector was handed the hellos only, not a message per beat.
        info = await nats_bus.js.consumer_info(HEARTBEAT.name, DURABLE)
        alive = await nats_bus.js.stream_info(ALIVE.name)
        assert info.delivered.stream_seq <= 5, info.delivered
        assert alive.state.last_seq >= 40, alive.state


async def test_a_goodbye_gets_the_restart_grace_and_not_more(
    nats_server: NatsServer, nats_bus: Bus, tmp_path: Path
) -> None:
    log = tmp_path / "detector.log"
    grace = {"NEURON_DRA_RESTART_GRACE_SECONDS": "8"}
    async with (
        fleet(nats_bus, ttl_nodes(f"node-{i}" for i in range(5))) as nodes,
        detector(nats_server, log, **grace),
    ):
        # node-0's agent stops in an orderly way; its next one starts 6 s later.
        nodes.up.discard("node-0")
        assert await nodes.beats["node-0"].goodbye()
        await asyncio.sleep(6)
        nodes.restart("node-0")
        # node-1's agent says goodbye and no agent follows within the 8 s grace.
        nodes.up.discard("node-1")
        assert await nodes.beats["node-1"].goodbye()
        await wait_for_event(nats_bus, NodeLost, "node-1", within=20)
        events = await node_events(nats_bus)
        assert declared(events) == [("NodeLost", "node-1")], log.read_text()[-3000:]
        [event] = events
        assert isinstance(event, NodeLost)
        assert "since its agent said it was stopping" in event.reason, event.reason
    assert "node agent back" in log.read_text()


async def test_a_server_restart_declares_nobody_lost(
    nats_server: NatsServer, nats_bus: Bus, tmp_path: Path
) -> None:
    log = tmp_path / "detector.log"
    async with (
        fleet(nats_bus, ttl_nodes(f"node-{i}" for i in range(6))) as nodes,
        detector(nats_server, log),
    ):
        # Down longer than a TTL: every beat the server held expires at its start.
        await nats_server.restart_async(down_for=5.0)
        await asyncio.sleep(20)
        assert await node_events(nats_bus) == [], log.read_text()[-3000:]
        # And it judges again: a node silent now is lost.
        nodes.up.discard("node-5")
        await wait_for_event(nats_bus, NodeLost, "node-5", within=15)
    assert "judging nobody" in log.read_text() or "bus back" in log.read_text()


async def test_old_and_new_agents_are_judged_side_by_side(
    nats_server: NatsServer, nats_bus: Bus, tmp_path: Path
) -> None:
    log = tmp_path / "detector.log"
    modes: dict[str, Literal["stream", "ttl"]] = {
        **{f"old-{i}": "stream" for i in range(3)},
        **{f"new-{i}": "ttl" for i in range(3)},
    }
    async with fleet(nats_bus, modes) as nodes, detector(nats_server, log):
        await asyncio.sleep(2)
        nodes.up -= {"old-0", "new-0"}
        await wait_for_event(nats_bus, NodeLost, "old-0", within=15)
        await wait_for_event(nats_bus, NodeLost, "new-0", within=15)
        # A rolling update moves old-1 to ttl mode: goodbye, then the new agent's hello.
        nodes.up.discard("old-1")
        assert await nodes.beats["old-1"].goodbye()
        await asyncio.sleep(2)
        nodes.restart("old-1", "ttl")
        await asyncio.sleep(8)
        assert sorted(declared(await node_events(nats_bus))) == [
            ("NodeLost", "new-0"),
            ("NodeLost", "old-0"),
        ], log.read_text()[-3000:]


async def events_when_answered(bus: Bus) -> list[AnyEvent]:
    """The detector's events, read again while the streams elect new leaders."""
    for _ in range(60):
        with contextlib.suppress(nats.errors.Error, TimeoutError):
            return await node_events(bus)
        await asyncio.sleep(0.5)
    raise AssertionError("NEURON_HEALTH not readable for 30 s")


async def alive_leader(bus: Bus) -> str:
    for _ in range(100):
        with contextlib.suppress(Exception):
            info = await bus.js.stream_info(ALIVE.name)
            if info.cluster is not None and info.cluster.leader:
                return info.cluster.leader
        await asyncio.sleep(0.2)
    raise AssertionError("NEURON_ALIVE has no leader")


@pytest.mark.timeout(110)
async def test_killing_the_alive_streams_leader_declares_nobody_lost(
    nats_cluster: NatsCluster, tmp_path: Path
) -> None:
    bus = await Bus.connect(nats_cluster.urls, name="test")
    try:
        await bus.reconcile(replicas=3)
        log = tmp_path / "detector.log"
        names = [f"node-{i:02d}" for i in range(20)]
        async with (
            fleet(bus, ttl_nodes(names)) as nodes,
            detector(nats_cluster, log, NEURON_DRA_STREAM_REPLICAS="3"),
        ):
            await asyncio.sleep(2)
            nodes.up -= {"node-18", "node-19"}
            await asyncio.sleep(1)
            victim = await alive_leader(bus)
            killed = datetime.now(UTC)
            await asyncio.to_thread(nats_cluster.servers[victim].kill)
            print(f"killed {victim}, the leader of {ALIVE.name}, at {killed:%H:%M:%S.%f}")
            # The silent two are found once the detector trusts the answers again.
            deadline = time.monotonic() + 45
            for _ in range(90):
                if len(await events_when_answered(bus)) >= 2 or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.5)
            await asyncio.sleep(5)
            events = await events_when_answered(bus)
            assert sorted(declared(events)) == [
                ("NodeLost", "node-18"),
                ("NodeLost", "node-19"),
            ], log.read_text()[-4000:]
        assert "alive beats unknown" in log.read_text()
    finally:
        await bus.close()
