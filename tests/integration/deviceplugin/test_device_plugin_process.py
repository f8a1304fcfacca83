"""The device plugin as a process: started on a node's hardware, it registers every resource
with the kubelet, says so on /readyz, and on SIGTERM exits 0 and leaves no socket behind."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from neuron_dra_cli.stack.process import free_port
from neuron_dra_common.hardware.layout import NodePaths
from neuron_dra_common.hardware.simulate import write_node

from tests.integration.deviceplugin.test_device_plugin_grpc import WAIT, Kubelet, kubelet_server


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


async def test_the_plugin_registers_is_ready_and_stops_cleanly(root: Path) -> None:
    sim = write_node(root / "hw", instance_type="inf2.48xlarge", node_name="n1")
    plugins = root / "kubelet" / "device-plugins"
    plugins.mkdir(parents=True)
    port = free_port()
    env = {
        **os.environ,
        "NEURON_DRA_NODE_NAME": "n1",
        "NEURON_DRA_HOST_ROOT": str(sim.root),
        "NEURON_DRA_NEURON_LS_PATH": str(NodePaths(sim.root).neuron_ls_json),
        "NEURON_DRA_KUBELET_ROOT": str(root / "kubelet"),
        "NEURON_DRA_HTTP_HOST": "127.0.0.1",
        "NEURON_DRA_HTTP_PORT": str(port),
        "NEURON_DRA_HONOUR_ANNOTATIONS": "false",
        "NEURON_DRA_HEALTH_EVENTS": "false",
        "NEURON_DRA_KUBELET_WATCH_INTERVAL": "0.1",
    }
    kubelet = Kubelet()
    async with kubelet_server(plugins, kubelet):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "neuron_dra_device_plugin", env=env
        )
        try:
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
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), WAIT * 2) == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert list(plugins.glob("neuron-dra-*.sock")) == []
