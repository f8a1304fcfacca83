"""A node's discovery restarted under the failure detector, both as processes on a real
nats-server, beside other nodes' heartbeats: stopped with SIGTERM (a rolling update, `neuron-dra
dev restart`) it says goodbye, and a silence within the restart grace declares nothing; a
goodbye not followed by a heartbeat within the grace is a lost node; an agent killed with
SIGKILL says nothing and its node is lost after the usual three missed heartbeats."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from neuron_dra_common.bus import Bus
from neuron_dra_common.events import NodeLost, NodeRecovered

from tests.fixtures.nats import NatsServer
from tests.integration.discovery.test_discovery_service import (
    NODE,
    hw_root,  # noqa: F401  (the fixture, used by name)
    last_heartbeat,
    next_agent_heartbeat,
    stop,
)
from tests.integration.discovery.test_discovery_service import start as start_discovery
from tests.integration.health.test_failure_detector import (
    Nodes,
    beating,  # noqa: F401  (the fixture, used by name)
    node_events,
    start_detector,
    started,
    wait_for_event,
)

#: The usual rule: three missed 1 s heartbeats (a judgement every 0.25 s).
WINDOW = 3.0


def verdicts_text(events: Sequence[object]) -> list[tuple[str, str]]:
    return [(type(e).__name__, str(getattr(e, "node", ""))) for e in events]


async def agent_running(
    nats: NatsServer, bus: Bus, root: Path, log: Path, *, first: bool = False
) -> subprocess.Popen[bytes]:
    """Discovery for NODE, once its first heartbeat is on the bus."""
    before = None if first else await last_heartbeat(bus)
    proc = start_discovery(nats, root, log)
    await next_agent_heartbeat(bus, after=before)
    return proc


def stopped(agent: subprocess.Popen[bytes], log: Path) -> None:
    if agent.poll() is None:
        stop(agent, log)


def stop_detector(detector: subprocess.Popen[bytes], log: Path) -> None:
    detector.send_signal(signal.SIGTERM)
    assert detector.wait(timeout=30) == 0, log.read_text()[-3000:]


async def test_a_restart_within_the_grace_declares_nothing(
    nats_server: NatsServer,
    nats_bus: Bus,
    beating: Nodes,  # noqa: F811
    hw_root: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    detector_log, agent_log = tmp_path / "detector.log", tmp_path / "discovery.log"
    # A grace far above the restart, so a slow start on a busy machine stays inside it.
    detector = start_detector(nats_server, detector_log, NEURON_DRA_RESTART_GRACE_SECONDS="90")
    agent = await agent_running(nats_server, nats_bus, hw_root, agent_log, first=True)
    try:
        await started(detector_log)
        stop(agent, agent_log)  # SIGTERM: the goodbye
        stopped_at = time.monotonic()
        await asyncio.sleep(2 * WINDOW)  # silent for longer than the usual rule allows
        agent = await agent_running(nats_server, nats_bus, hw_root, agent_log)
        print(f"goodbye -> the next agent's first heartbeat: {time.monotonic() - stopped_at:.1f} s")
        await asyncio.sleep(WINDOW)
        events = await node_events(nats_bus)
        text = detector_log.read_text()
        assert verdicts_text(events) == [], text[-3000:]
        assert "node agent restarting" in text
        assert "node agent back" in text
    finally:
        stopped(agent, agent_log)
        stop_detector(detector, detector_log)


async def test_a_goodbye_without_a_return_is_lost_when_the_grace_runs_out(
    nats_server: NatsServer,
    nats_bus: Bus,
    beating: Nodes,  # noqa: F811
    hw_root: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    detector_log, agent_log = tmp_path / "detector.log", tmp_path / "discovery.log"
    grace = 12.0
    detector = start_detector(
        nats_server, detector_log, NEURON_DRA_RESTART_GRACE_SECONDS=str(grace)
    )
    agent = await agent_running(nats_server, nats_bus, hw_root, agent_log, first=True)
    try:
        await started(detector_log)
        stop(agent, agent_log)
        stopped_at = time.monotonic()
        declared = await wait_for_event(nats_bus, NodeLost, NODE, within=grace + 30)
        print(f"goodbye -> NodeLost: {declared - stopped_at:.1f} s (grace {grace:g} s)")
        assert declared - stopped_at >= grace - 0.5
        (lost,) = await node_events(nats_bus)
        assert isinstance(lost, NodeLost)
        assert "said it was stopping" in lost.reason
    finally:
        stopped(agent, agent_log)
        stop_detector(detector, detector_log)


async def test_an_agent_killed_without_a_goodbye_is_lost_as_before_and_recovers(
    nats_server: NatsServer,
    nats_bus: Bus,
    beating: Nodes,  # noqa: F811
    hw_root: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    detector_log, agent_log = tmp_path / "detector.log", tmp_path / "discovery.log"
    grace = 90.0
    detector = start_detector(
        nats_server, detector_log, NEURON_DRA_RESTART_GRACE_SECONDS=str(grace)
    )
    agent = await agent_running(nats_server, nats_bus, hw_root, agent_log, first=True)
    try:
        await started(detector_log)
        agent.send_signal(signal.SIGKILL)
        agent.wait(timeout=10)
        killed = time.monotonic()
        declared = await wait_for_event(nats_bus, NodeLost, NODE, within=30)
        print(f"kill -9 -> NodeLost: {declared - killed:.1f} s")
        assert "node agent restarting" not in detector_log.read_text()
        # The next process numbers its heartbeats from 1 again: heard, so the node recovers.
        agent = await agent_running(nats_server, nats_bus, hw_root, agent_log)
        await wait_for_event(nats_bus, NodeRecovered, NODE, within=30)
        assert verdicts_text(await node_events(nats_bus)) == [
            ("NodeLost", NODE),
            ("NodeRecovered", NODE),
        ]
    finally:
        stopped(agent, agent_log)
        stop_detector(detector, detector_log)
