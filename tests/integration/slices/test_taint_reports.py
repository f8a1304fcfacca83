"""The slice publisher as a process, on a real NATS and the local stack's apiserver: a device
taint set and then cleared is each reported once on the bus (``DeviceTaintChanged``), with
the node, device, taints and why; pool rewrites, repeated health news and a kill -9 of the
publisher report nothing again. Audit and ``neuron-dra events`` show the reports."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from neuron_dra_cli.stack.components import python_service
from neuron_dra_common.bus import Bus, replay
from neuron_dra_common.bus.declarations import AUDIT, TAINTS
from neuron_dra_common.events import DeviceHealthChanged, DeviceTaintChanged, NodeInventory
from neuron_dra_common.hardware.model import NeuronDevice, NodeHardware
from neuron_dra_slice_publisher.pool import NodeRef

from tests.fixtures.nats import NatsServer
from tests.fixtures.stack import KubeStack
from tests.fixtures.subscribers import ServiceProcess

KEY = "neuron.aws.com/hardware-error"
DEVICE = "neurondevice3"
T0 = datetime(2026, 11, 26, 9, 0, tzinfo=UTC)
CLI = (sys.executable, "-m", "neuron_dra_cli", "events")


@pytest.fixture
def publisher(
    nats_server: NatsServer, kube_stack: KubeStack, tmp_path: Path
) -> Iterator[ServiceProcess]:
    """A slice publisher of its own (own bus, own Lease) beside the stack's; it writes only
    the pool of the test's Node, the only node with an inventory on its bus."""
    component = python_service(
        name="slice-publisher",
        kind="slice-publisher",
        module="neuron_dra_slice_publisher",
        env={
            "NEURON_DRA_KUBECONFIG": str(kube_stack.kubeconfig),
            **nats_server.open_env,
            "NEURON_DRA_IDENTITY": "taint-reports",
            "NEURON_DRA_LEASE_NAME": f"taint-reports-{uuid.uuid4().hex[:8]}",
            "NEURON_DRA_LEASE_SECONDS": "4",
        },
    )
    service = ServiceProcess(component, log=tmp_path / "slice-publisher.log")
    try:
        yield service
    finally:
        service.stop()


def inventory(node: str, generation: int) -> NodeInventory:
    return NodeInventory(
        node=node,
        boot_id="boot",
        generation=generation,
        hardware=NodeHardware(
            instance_type="trn2.48xlarge",
            driver_version="2.24.7.0",
            devices=tuple(NeuronDevice(index=i) for i in range(16)),
        ),
    )


def health(node: str, *, bad: bool, at: datetime) -> DeviceHealthChanged:
    if not bad:
        return DeviceHealthChanged(
            node=node, device=DEVICE, health="Healthy", previous="Unhealthy", observed_at=at
        )
    return DeviceHealthChanged(
        node=node,
        device=DEVICE,
        health="Unhealthy",
        previous="Healthy",
        error_type="SRAM_UNCORRECTABLE_ERROR",
        severity="uncorrectable",
        action="replace-instance",
        evidence="NEURON_HW_ERR=SRAM_UNCORRECTABLE_ERROR nd-id=3 nc-id=0",
        observed_at=at,
    )


def stored_taints(stack: KubeStack, node: str) -> tuple[int, list[Any]]:
    """The pool's generation in the apiserver and the taints of the device in it."""
    items = stack.get_json("resourceslices", "--field-selector", f"spec.nodeName={node}")["items"]
    if not items:
        return 0, []
    top = max(s["spec"]["pool"]["generation"] for s in items)
    taints = [
        t
        for s in items
        if s["spec"]["pool"]["generation"] == top
        for d in s["spec"].get("devices") or []
        if d["name"] == DEVICE
        for t in d.get("taints") or []
    ]
    return top, taints


async def wait_for(what: str, probe: Any, *, within: float = 60) -> Any:
    deadline = time.monotonic() + within
    while True:
        found = await asyncio.to_thread(probe)
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out after {within} s waiting for {what}"
        await asyncio.sleep(0.3)


async def reports(bus: Bus, node: str) -> list[DeviceTaintChanged]:
    events = await replay(
        bus, name="test-reader", stream=TAINTS.name, subject=f"neuron.taint.{node}.>"
    )
    return [e for e in events if isinstance(e, DeviceTaintChanged)]


async def test_setting_and_clearing_a_taint_are_each_reported_once(
    nats_bus: Bus,
    nats_server: NatsServer,
    kube_stack: KubeStack,
    owner_node: NodeRef,
    publisher: ServiceProcess,
) -> None:
    node = owner_node.name
    bus = nats_bus.publisher(source="/test/discovery")
    await bus.publish(inventory(node, 1))
    publisher.start()
    generation = await wait_for("the node's pool", lambda: stored_taints(kube_stack, node)[0])
    assert await reports(nats_bus, node) == []

    await bus.publish(health(node, bad=True, at=T0))
    _, taints = await wait_for(
        "the taint in the apiserver",
        lambda: (found := stored_taints(kube_stack, node))[1] and found,
    )
    assert [(t["key"], t["value"], t["effect"]) for t in taints] == [
        (KEY, "SRAM_UNCORRECTABLE_ERROR", "NoExecute")
    ]
    [chip] = [r for r in await _settled(nats_bus, node, 2) if r.device == DEVICE]
    assert [(t.key, t.value, t.effect) for t in chip.taints] == [
        (KEY, "SRAM_UNCORRECTABLE_ERROR", "NoExecute")
    ]
    assert chip.previous == ()
    assert chip.node == node
    assert "SRAM_UNCORRECTABLE_ERROR uncorrectable" in chip.reason
    assert "nd-id=3" in chip.reason
    assert not chip.withheld

    # The same news again, a newer inventory (the pool is written again) and a publisher
    # killed and started again: the taint is unchanged, so nothing more is reported.
    await bus.publish(health(node, bad=True, at=T0))
    await bus.publish(inventory(node, 2))
    await wait_for(
        "the pool written again", lambda: stored_taints(kube_stack, node)[0] > generation
    )
    publisher.kill9()
    publisher.start()
    await asyncio.sleep(3)
    assert len(await reports(nats_bus, node)) == 2

    await bus.publish(health(node, bad=False, at=T0 + timedelta(seconds=5)))
    await wait_for("the taint removed", lambda: stored_taints(kube_stack, node)[1] == [])
    got = await _settled(nats_bus, node, 4)
    by_device: dict[str, list[DeviceTaintChanged]] = {}
    for report in got:
        by_device.setdefault(report.device, []).append(report)
    # The chip and the node's whole-node device: each set once and cleared once.
    assert set(by_device) == {DEVICE, "neuronnode"}
    for device, seen in by_device.items():
        assert [bool(r.taints) for r in seen] == [True, False], device
        assert seen[1].previous == seen[0].taints
    assert by_device[DEVICE][1].reason == "healthy again"

    # The audit view holds them, and `neuron-dra events` shows them for the node.
    audited = await replay(
        nats_bus, name="test-reader", stream=AUDIT.name, subject=f"neuron.taint.{node}.>"
    )
    assert len(audited) == 4
    done = await asyncio.to_thread(
        subprocess.run,
        [*CLI, "--nats-servers", nats_server.url, "--node", node, "--since", "1h"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    lines = [line for line in done.stdout.splitlines() if f"devices/{DEVICE}" in line]
    assert any(f"tainted {KEY}=SRAM_UNCORRECTABLE_ERROR:NoExecute" in line for line in lines), (
        done.stdout
    )
    assert any(line.rstrip().endswith("untainted - healthy again") for line in lines), done.stdout


async def _settled(bus: Bus, node: str, count: int) -> list[DeviceTaintChanged]:
    """The node's reports once ``count`` are there and a while has passed with no more."""
    deadline = time.monotonic() + 30
    while len(got := await reports(bus, node)) < count:
        assert time.monotonic() < deadline, f"{len(got)} of {count} taint reports: {got}"
        await asyncio.sleep(0.2)
    await asyncio.sleep(2)
    got = await reports(bus, node)
    assert len(got) == count, got
    return got
