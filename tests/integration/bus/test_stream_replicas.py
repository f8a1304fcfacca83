"""A three-server NATS cluster, as the eks overlay runs it: every stream kept in three copies,
never fewer, and the bus keeps working when one server goes."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from neuron_dra_common.bus import STREAMS, Bus
from neuron_dra_common.bus.declarations import HEARTBEAT
from neuron_dra_common.events import NodeHeartbeat

from tests.fixtures.nats import free_port, nats_binary


@dataclass
class Server:
    name: str
    port: int
    monitor: int
    cluster: int
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[Server]]:
    servers = [Server(f"nats-{i}", free_port(), free_port(), free_port()) for i in range(3)]
    routes = ",".join(f"nats://127.0.0.1:{s.cluster}" for s in servers)
    for s in servers:
        store = tmp_path / s.name
        store.mkdir()
        args = [
            str(nats_binary()),
            "-js",
            "-n", s.name,
            "-a", "127.0.0.1",
            "-p", str(s.port),
            "-m", str(s.monitor),
            "-sd", str(store),
            "--cluster_name", "neuron-dra",
            "--cluster", f"nats://127.0.0.1:{s.cluster}",
            "--routes", routes,
        ]  # fmt: skip
        with (tmp_path / f"{s.name}.log").open("ab") as log:
            s.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    try:
        for s in servers:
            _wait_healthy(s, tmp_path / f"{s.name}.log")
        yield servers
    finally:
        for s in servers:
            if s.proc is not None and s.proc.poll() is None:
                s.proc.terminate()
                s.proc.wait(10)


def _wait_healthy(server: Server, log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert server.proc is not None
        assert server.proc.poll() is None, log.read_text()[-2000:]
        with contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError):
            url = f"http://127.0.0.1:{server.monitor}/healthz?js-enabled-only=true"
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        time.sleep(0.1)
    raise TimeoutError(f"{server.name} not healthy: {log.read_text()[-2000:]}")


@pytest.fixture
async def bus(cluster: list[Server]) -> AsyncIterator[Bus]:
    bus = await Bus.connect([s.url for s in cluster], name="test")
    try:
        yield bus
    finally:
        with contextlib.suppress(Exception):
            await bus.close()


async def _reconcile(bus: Bus, *, replicas: int) -> dict[str, str]:
    # A new cluster elects its JetStream leader after the servers answer /healthz.
    deadline = time.monotonic() + 30.0
    while True:
        try:
            return dict(await bus.reconcile(replicas=replicas))
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def test_streams_get_three_copies_and_a_smaller_setting_never_removes_them(
    bus: Bus,
) -> None:
    created = await _reconcile(bus, replicas=3)
    assert set(created.values()) == {"created"}
    for spec in STREAMS:
        info = await bus.js.stream_info(spec.name)
        assert info.config.num_replicas == 3, spec.name
        assert info.cluster is not None, spec.name
        assert len(info.cluster.replicas or ()) == 2, spec.name
    # A process left at the default (one copy) starting later takes nothing away.
    again = await _reconcile(bus, replicas=1)
    assert set(again.values()) == {"unchanged"}
    for spec in STREAMS:
        assert (await bus.js.stream_info(spec.name)).config.num_replicas == 3, spec.name


async def test_the_bus_keeps_its_streams_when_one_server_goes(
    bus: Bus, cluster: list[Server]
) -> None:
    await _reconcile(bus, replicas=3)
    publisher = bus.publisher(source="test")
    event = NodeHeartbeat(node="trn2-0", boot_id="b", sequence=1, sent_at=datetime.now(UTC))
    await publisher.publish(event)
    leader = (await bus.js.stream_info(HEARTBEAT.name)).cluster
    assert leader is not None
    [down] = [s for s in cluster if s.name == leader.leader]
    assert down.proc is not None
    down.proc.kill()
    down.proc.wait()
    # The other two elect a new leader and serve the same message; publishing goes on.
    deadline = time.monotonic() + 30
    while True:
        try:
            msg = await bus.js.get_last_msg(HEARTBEAT.name, event.subject)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
    assert msg.data
    later = NodeHeartbeat(node="trn2-0", boot_id="b", sequence=2, sent_at=datetime.now(UTC))
    await publisher.publish(later)
    info = await bus.js.stream_info(HEARTBEAT.name)
    assert info.cluster is not None
    assert info.cluster.leader != down.name
