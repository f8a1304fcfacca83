"""The health probe process against a simulated node and a real NATS server.

Faults are injected the way ``neuron-dra dev fault`` does (kernel log line, counters, links);
what the probe publishes is read back from the NEURON_HEALTH stream.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from neuron_dra_common.bus import Bus, replay
from neuron_dra_common.bus.declarations import HEALTH
from neuron_dra_common.events import DeviceHealthChanged
from neuron_dra_common.hardware.layout import NodePaths
from neuron_dra_common.hardware.simulate import (
    inject_fault,
    ultraserver_members,
    write_counter,
    write_node,
)

from tests.contracts.support import wait_until
from tests.fixtures.nats import NatsServer

NODE = "trn2-48xl-9"


def start(nats: NatsServer, root: Path, tmp_path: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "NEURON_DRA_NODE_NAME": NODE,
        "NEURON_DRA_HOST_ROOT": str(root),
        "NEURON_DRA_KERNEL_LOG": str(NodePaths(root).kernel_log),
        "NEURON_DRA_STATE_PATH": str(tmp_path / "probe-state.json"),
        **nats.open_env,
        "NEURON_DRA_NODE_CONDITIONS": "false",
        "NEURON_DRA_HTTP_HOST": "127.0.0.1",
        "NEURON_DRA_HTTP_PORT": "0",
        "NEURON_DRA_POLL_SECONDS": "0.2",
    }
    with (tmp_path / "probe.log").open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "neuron_dra_health_monitor.probe_main"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def stop(proc: subprocess.Popen[bytes], tmp_path: Path) -> None:
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=30)
    assert code == 0, (tmp_path / "probe.log").read_text()


async def events(bus: Bus) -> list[DeviceHealthChanged]:
    stored = await replay(
        bus, name="test-reader", stream=HEALTH.name, subject=f"neuron.health.{NODE}.>"
    )
    return [e for e in stored if isinstance(e, DeviceHealthChanged)]


async def wait_events(bus: Bus, count: int) -> list[DeviceHealthChanged]:
    seen: list[DeviceHealthChanged] = []

    async def enough() -> bool:
        nonlocal seen
        seen = await events(bus)
        return len(seen) >= count

    for _ in range(600):
        if await enough():
            return seen
        await asyncio.sleep(0.1)
    raise AssertionError(f"expected {count} health events, got {seen}")


async def ready(tmp_path: Path) -> None:
    # The probe has read the hardware once (its baseline) when it saved its state.
    await wait_until(
        lambda: (tmp_path / "probe-state.json").exists(), within=60, what="the probe's state"
    )


@pytest.fixture
def hw_root(tmp_path: Path) -> Path:
    return write_node(tmp_path / "hw", instance_type="trn2.48xlarge", node_name=NODE).root


async def test_faults_are_published_once_with_type_severity_evidence_and_action(
    nats_server: NatsServer, nats_bus: Bus, hw_root: Path, tmp_path: Path
) -> None:
    # Errors counted before the probe started are history, not news.
    write_counter(hw_root, device=1, counter="sram_ecc_uncorrected", total=4, present=0)
    proc = start(nats_server, hw_root, tmp_path)
    try:
        await ready(tmp_path)
        inject_fault(hw_root, fault="sram", node_name=NODE, device=3)
        [sram] = await wait_events(nats_bus, 1)
        assert (sram.device, sram.health, sram.previous) == (
            "neurondevice3",
            "Unhealthy",
            "Healthy",
        )
        assert (sram.error_type, sram.severity) == ("SRAM_UNCORRECTABLE_ERROR", "uncorrectable")
        assert sram.action == "replace-instance"
        assert sram.core == 0
        assert sram.evidence.startswith("NEURON_HW_ERR=SRAM_UNCORRECTABLE_ERROR ")
        assert "nd-id=3" in sram.evidence

        inject_fault(hw_root, fault="sram", node_name=NODE, device=3)  # the same error again
        inject_fault(hw_root, fault="hbm-repairable", node_name=NODE, device=8)
        inject_fault(hw_root, fault="link-down", node_name=NODE, device=0)
        got = await wait_events(nats_bus, 4)
        await asyncio.sleep(1.0)
        got = await events(nats_bus)
        by_device = {e.device: e for e in got[1:]}
        assert len(got) == 4, got  # the repeated SRAM error made no event
        assert (by_device["neurondevice8"].severity, by_device["neurondevice8"].action) == (
            "degraded",
            "reload-driver-or-reboot",
        )
        assert by_device["neurondevice8"].evidence == (
            "neuron8 mem_ecc_repairable_uncorrected total 0 -> 1"
        )
        # A link has two ends: device 0 and its upper neighbour 12.
        assert {e.device for e in got if e.error_type == "NEURONLINK_DOWN"} == {
            "neurondevice0",
            "neurondevice12",
        }

        inject_fault(hw_root, fault="repair", node_name=NODE)
        got = await wait_events(nats_bus, 8)
        healthy = {e.device for e in got[4:] if e.health == "Healthy"}
        assert healthy == {"neurondevice0", "neurondevice3", "neurondevice8", "neurondevice12"}
        assert all(e.severity == "" and e.error_type == "" for e in got[4:])
    finally:
        stop(proc, tmp_path)


async def test_a_restart_neither_repeats_nor_misses(
    nats_server: NatsServer, nats_bus: Bus, hw_root: Path, tmp_path: Path
) -> None:
    proc = start(nats_server, hw_root, tmp_path)
    try:
        await ready(tmp_path)
        inject_fault(hw_root, fault="hbm", node_name=NODE, device=5)
        await wait_events(nats_bus, 1)
    finally:
        stop(proc, tmp_path)
    # While the probe is down: a new error elsewhere, and device 5 repaired.
    inject_fault(hw_root, fault="nc", node_name=NODE, device=2)
    inject_fault(hw_root, fault="repair", node_name=NODE, device=5)
    proc = start(nats_server, hw_root, tmp_path)
    try:
        got = await wait_events(nats_bus, 3)
        await asyncio.sleep(1.5)
        got = await events(nats_bus)
    finally:
        stop(proc, tmp_path)
    summary = [(e.device, e.health, e.error_type) for e in got]
    assert summary == [
        ("neurondevice5", "Unhealthy", "HBM_UNCORRECTABLE_ERROR"),
        ("neurondevice2", "Unhealthy", "NC_UNCORRECTABLE_ERROR"),
        ("neurondevice5", "Healthy", ""),
    ] or summary == [
        ("neurondevice5", "Unhealthy", "HBM_UNCORRECTABLE_ERROR"),
        ("neurondevice5", "Healthy", ""),
        ("neurondevice2", "Unhealthy", "NC_UNCORRECTABLE_ERROR"),
    ], summary


async def test_a_broken_kernel_line_is_logged_and_skipped(
    nats_server: NatsServer, nats_bus: Bus, hw_root: Path, tmp_path: Path
) -> None:
    proc = start(nats_server, hw_root, tmp_path)
    try:
        await ready(tmp_path)
        with NodePaths(hw_root).kernel_log.open("a") as log:
            log.write("kernel: NEURON_HW_ERR=DMA_ERROR nd-id=banana\n")
        inject_fault(hw_root, fault="dma", node_name=NODE, device=4)
        [dma] = await wait_events(nats_bus, 1)
        assert (dma.device, dma.error_type) == ("neurondevice4", "DMA_ERROR")
    finally:
        stop(proc, tmp_path)
    text = (tmp_path / "probe.log").read_text()
    assert "kernel error line not understood" in text
    assert "nd-id is not a device number" in text


async def test_an_ultraserver_node_losing_modes_degrades_its_node_device(
    nats_server: NatsServer, nats_bus: Bus, tmp_path: Path
) -> None:
    root = write_node(
        tmp_path / "us",
        instance_type="trn2u.48xlarge",
        node_name=NODE,
        ultraserver=ultraserver_members(index=0)[1],
    ).root
    modes = NodePaths(root).class_file("ultraserver_mode")
    proc = start(nats_server, root, tmp_path)
    try:
        await ready(tmp_path)
        # The links to the other nodes went down: only the single-node mode is left.
        modes.write_text("4\n")
        [down] = await wait_events(nats_bus, 1)
        assert (down.device, down.error_type, down.severity) == (
            "neuronnode",
            "NEURONLINK_DOWN",
            "degraded",
        )
        assert down.evidence == "ultraserver_mode 1,2,3,4 -> 4"
        modes.write_text("1,2,3,4\n")
        got = await wait_events(nats_bus, 2)
        assert (got[1].device, got[1].health) == ("neuronnode", "Healthy")
    finally:
        stop(proc, tmp_path)
