"""The discovery process against simulated hardware and a real NATS server."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from neuron_dra_common.bus import Bus, replay
from neuron_dra_common.bus.declarations import HEARTBEAT, INVENTORY
from neuron_dra_common.events import NodeHeartbeat, NodeInventory, decode
from neuron_dra_common.hardware.simulate import write_node

from tests.contracts.support import wait_until
from tests.fixtures.nats import NatsServer

NODE = "trn2-48xl-7"


def start(nats: NatsServer, root: Path, log: Path, **extra: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "NEURON_DRA_NODE_NAME": NODE,
        "NEURON_DRA_HOST_ROOT": str(root),
        "NEURON_DRA_NEURON_LS_COMMAND": f"{root}/opt/aws/neuron/bin/neuron-ls,-j",
        **nats.open_env,
        "NEURON_DRA_HTTP_HOST": "127.0.0.1",
        "NEURON_DRA_HTTP_PORT": "0",
        "NEURON_DRA_POLL_SECONDS": "0.2",
        **extra,
    }
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "neuron_dra_discovery"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


@pytest.fixture
def hw_root(tmp_path: Path) -> Path:
    sim = write_node(tmp_path / "hw", instance_type="trn2.48xlarge", node_name=NODE)
    assert Path(sim.neuron_ls_command[0]).exists()
    return sim.root


async def latest_inventory(bus: Bus) -> tuple[int, NodeInventory]:
    """The stream's message count and its one stored inventory of NODE."""
    for _ in range(200):
        info = await bus.js.stream_info(INVENTORY.name)
        if info.state.messages:
            # The stream files it in a bucket: neuron.inventory.<bucket>.<node>.
            msg = await bus.js.get_last_msg(INVENTORY.name, f"neuron.inventory.*.{NODE}")
            event = decode(msg.data or b"")
            assert isinstance(event, NodeInventory)
            return int(info.state.last_seq), event
        await asyncio.sleep(0.05)
    raise AssertionError("no inventory published within 10 s")


def published(log: Path) -> int:
    """How many times the agents writing ``log`` have sent an inventory."""
    return log.read_text().count('"message":"inventory published"')


def stop(proc: subprocess.Popen[bytes], log: Path) -> None:
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=20)
    assert code == 0, log.read_text()


async def test_publishes_on_start_and_on_change_and_exits_cleanly(
    nats_server: NatsServer, nats_bus: Bus, hw_root: Path, tmp_path: Path
) -> None:
    log = tmp_path / "discovery.log"
    proc = start(nats_server, hw_root, log)
    try:
        seq, first = await latest_inventory(nats_bus)
        assert first.hardware.instance_type == "trn2.48xlarge"
        assert len(first.hardware.devices) == 16
        assert first.hardware.driver_version == "2.24.7.0"
        # Nothing changed: a few polls later, still one stored inventory.
        await asyncio.sleep(1.0)
        assert (await latest_inventory(nats_bus))[0] == seq

        (hw_root / "sys/module/neuron/version").write_text("2.26.0.0\n")
        for _ in range(100):
            seq2, changed = await latest_inventory(nats_bus)
            if changed.hardware.driver_version == "2.26.0.0":
                break
            await asyncio.sleep(0.1)
        assert changed.hardware.driver_version == "2.26.0.0"
        assert changed.generation > first.generation
        assert seq2 == seq + 1
        beat = await nats_bus.js.get_last_msg(HEARTBEAT.name, f"neuron.heartbeat.{NODE}")
        assert isinstance(decode(beat.data or b""), NodeHeartbeat)
    finally:
        stop(proc, log)


async def test_a_restart_with_the_same_hardware_stores_nothing_new(
    nats_server: NatsServer, nats_bus: Bus, hw_root: Path, tmp_path: Path
) -> None:
    log = tmp_path / "discovery.log"
    # Content is de-duplicated within one heartbeat period: a day-long period keeps both
    # starts inside one period however slow the restart is.
    day = {"NEURON_DRA_HEARTBEAT_SECONDS": "86400"}
    proc = start(nats_server, hw_root, log, **day)
    try:
        seq, _ = await latest_inventory(nats_bus)
    finally:
        stop(proc, log)
    proc = start(nats_server, hw_root, log, **day)
    try:
        # The second agent has sent its inventory; the stream kept only the first.
        await wait_until(lambda: published(log) >= 2, within=60, what="the second inventory")
        seq_after, _ = await latest_inventory(nats_bus)
    finally:
        stop(proc, log)
    assert seq_after == seq, "identical inventory stored twice"


async def test_a_missing_device_is_reported_not_fatal(
    nats_server: NatsServer, nats_bus: Bus, tmp_path: Path
) -> None:
    sim = write_node(
        tmp_path / "odd", instance_type="trn2.48xlarge", node_name=NODE, missing_devices=[3]
    )
    log = tmp_path / "discovery.log"
    proc = start(nats_server, sim.root, log)
    try:
        _, inventory = await latest_inventory(nats_bus)
    finally:
        stop(proc, log)
    assert 3 not in {d.index for d in inventory.hardware.devices}
    assert inventory.hardware.problems


def test_bad_settings_exit_with_the_variable_named(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "neuron_dra_discovery"],
        env={**os.environ, "NEURON_DRA_NODE_NAME": "n", "NEURON_DRA_POLL_SECONDS": "-1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "NEURON_DRA_POLL_SECONDS='-1'" in proc.stderr


async def last_heartbeat(bus: Bus, node: str = NODE) -> NodeHeartbeat | None:
    """The stream's heartbeat of ``node`` (it keeps the latest), if any."""
    subject = f"neuron.heartbeat.{node}"
    stored = await replay(bus, name="test-reader", stream=HEARTBEAT.name, subject=subject)
    beats = [e for e in stored if isinstance(e, NodeHeartbeat)]
    return beats[-1] if beats else None


async def next_agent_heartbeat(
    bus: Bus, *, after: NodeHeartbeat | None, node: str = NODE
) -> NodeHeartbeat:
    """The stream's heartbeat of ``node`` once one from a process other than ``after``'s is
    there."""
    for _ in range(300):
        beat = await last_heartbeat(bus, node)
        if beat is not None and (after is None or beat.instance != after.instance):
            return beat
        await asyncio.sleep(0.2)
    raise AssertionError(f"no heartbeat of {node} from a new agent process within 60 s")


async def test_a_stopped_agent_says_goodbye_and_a_killed_one_does_not(
    nats_server: NatsServer, nats_bus: Bus, hw_root: Path, tmp_path: Path
) -> None:
    """SIGTERM: the last heartbeat is marked ``stopping``. The next process has an instance of
    its own and numbers from 1. SIGKILL: the last heartbeat is an ordinary one."""
    log = tmp_path / "discovery.log"
    proc = start(nats_server, hw_root, log)
    try:
        running = await next_agent_heartbeat(nats_bus, after=None)
        assert not running.stopping
        assert running.instance
    finally:
        stop(proc, log)
    goodbye = await last_heartbeat(nats_bus)
    assert goodbye is not None
    assert goodbye.stopping
    assert goodbye.instance == running.instance
    assert goodbye.sequence > running.sequence

    proc = start(nats_server, hw_root, log)
    try:
        second = await next_agent_heartbeat(nats_bus, after=goodbye)
        assert not second.stopping
        assert second.sequence < goodbye.sequence
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=20)
    killed = await last_heartbeat(nats_bus)
    assert killed is not None
    assert killed.instance == second.instance
    assert not killed.stopping
