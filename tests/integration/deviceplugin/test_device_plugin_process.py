"""The device plugin as a process: started on a node's hardware, it registers every resource
with the kubelet, says so on /readyz, and on SIGTERM exits 0 and leaves no socket behind; with
NATS it sends the node's heartbeats, the last one marked as an orderly stop."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from neuron_dra_cli.stack.process import free_port
from neuron_dra_common.bus import Bus
from neuron_dra_common.hardware.layout import NodePaths
from neuron_dra_common.hardware.simulate import write_node
from neuron_dra_device_plugin.registration import KUBELET_SOCKET, kubelet_socket_probe

from tests.fixtures.nats import NatsServer
from tests.integration.deviceplugin.test_device_plugin_grpc import WAIT, Kubelet, kubelet_server
from tests.integration.discovery.test_discovery_service import last_heartbeat, next_agent_heartbeat


@pytest.fixture
def root() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="dpp-", dir="/tmp") as short:
        yield Path(short)


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def plugin_env(root: Path, port: int, **extra: str) -> dict[str, str]:
    """The plugin's environment for node ``n1`` (an inf2.48xlarge) under ``root``, kubelet
    annotations off; health events and heartbeats off unless ``extra`` turns them on."""
    sim = write_node(root / "hw", instance_type="inf2.48xlarge", node_name="n1")
    (root / "kubelet" / "device-plugins").mkdir(parents=True)
    return {
        **os.environ,
        "NEURON_DRA_NODE_NAME": "n1",
        "NEURON_DRA_HOST_ROOT": str(sim.root),
        "NEURON_DRA_NEURON_LS_PATH": str(NodePaths(sim.root).neuron_ls_json),
        "NEURON_DRA_KUBELET_ROOT": str(root / "kubelet"),
        "NEURON_DRA_HTTP_HOST": "127.0.0.1",
        "NEURON_DRA_HTTP_PORT": str(port),
        "NEURON_DRA_HONOUR_ANNOTATIONS": "false",
        "NEURON_DRA_HEALTH_EVENTS": "false",
        "NEURON_DRA_HEARTBEATS": "false",
        "NEURON_DRA_KUBELET_WATCH_INTERVAL": "0.1",
        **extra,
    }


@contextlib.asynccontextmanager
async def plugin_process(env: dict[str, str]) -> AsyncIterator[asyncio.subprocess.Process]:
    """The plugin as a process with ``env``; killed on the way out unless it has exited."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "neuron_dra_device_plugin", env=env
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def stop(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM, and the plugin exits 0."""
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), WAIT * 2) == 0


async def test_the_plugin_registers_is_ready_and_stops_cleanly(root: Path) -> None:
    port = free_port()
    env = plugin_env(root, port)
    plugins = root / "kubelet" / "device-plugins"
    kubelet = Kubelet()
    async with kubelet_server(plugins, kubelet), plugin_process(env) as proc:
        await kubelet.wait_for(3)
        ready = f"http://127.0.0.1:{port}/readyz"
        for _ in range(int(WAIT * 10)):
            if await asyncio.to_thread(status, ready) == 200:
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail(f"{ready} never answered 200")
        assert await asyncio.to_thread(status, f"http://127.0.0.1:{port}/healthz") == 200
        assert sorted(p.name for p in plugins.glob("neuron-dra-*.sock")) == [
            "neuron-dra-neuron.sock",
            "neuron-dra-neuroncore.sock",
            "neuron-dra-neurondevice.sock",
        ]
        await stop(proc)
    assert list(plugins.glob("neuron-dra-*.sock")) == []


async def test_the_plugin_sends_its_nodes_heartbeats_and_a_goodbye_on_sigterm(
    root: Path, nats_server: NatsServer, nats_bus: Bus
) -> None:
    """On a node kept on the device plugin no discovery agent runs: the plugin is what tells
    the failure detector that the node is alive."""
    env = plugin_env(
        root,
        free_port(),
        NEURON_DRA_NATS_SERVERS=nats_server.url,
        NEURON_DRA_INSECURE_BUS="1",
        NEURON_DRA_HEALTH_EVENTS="true",
        NEURON_DRA_HEARTBEATS="true",
        NEURON_DRA_LIVENESS_SECONDS="0.2",
    )
    plugins = root / "kubelet" / "device-plugins"
    async with kubelet_server(plugins, Kubelet()), plugin_process(env) as proc:
        first = await next_agent_heartbeat(nats_bus, after=None, node="n1")
        assert not first.stopping
        assert first.interval_seconds == 0.2
        await stop(proc)
    goodbye = await last_heartbeat(nats_bus, "n1")
    assert goodbye is not None
    assert goodbye.instance == first.instance
    assert goodbye.stopping


async def test_the_kubelet_probe_answers_while_a_kubelet_serves_its_socket(root: Path) -> None:
    """The plugin's sign of its kubelet's life: its socket answers. Not before the kubelet
    starts, not once it stopped, and again within a second or two (not after gRPC's growing
    back-off) when a new one starts."""
    plugins = root / "device-plugins"
    plugins.mkdir()
    probe = kubelet_socket_probe(plugins / KUBELET_SOCKET)
    assert not await probe()
    for _ in range(2):
        async with kubelet_server(plugins, Kubelet()):
            answers = [await probe() for _ in range(4)]
            # Each probe waits half a second at most: the first or second reaches the kubelet.
            assert answers[1:] == [True] * 3, answers
        assert not await probe()
        # Gone for longer than gRPC's default first back-off.
        await asyncio.sleep(2)
