"""Device health as taints on the pool: NoSchedule when degraded, NoExecute when
uncorrectable or lost, removed on repair; left out of the pool where taints are not served."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest
from neuron_dra_common.events import DeviceHealthChanged, DeviceTaintChanged, Event, NodeLost
from neuron_dra_common.kube import run_workers
from neuron_dra_slice_publisher.announce import TaintAnnouncer
from neuron_dra_slice_publisher.controller import Controller, NodeInfo
from neuron_dra_slice_publisher.slices import NodeDeviceMode, build_pool
from neuron_dra_slice_publisher.store import MemorySliceStore
from neuron_dra_slice_publisher.taints import (
    HARDWARE_ERROR_KEY,
    HealthTaints,
    taint_json,
    taint_of,
)

from tests.unit.slices.support import hardware
from tests.unit.slices.test_controller import World, inventory

T0 = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def health(
    device: str,
    error_type: str = "",
    severity: Any = "",
    *,
    node: str = "n1",
    at: datetime = T0,
) -> DeviceHealthChanged:
    return DeviceHealthChanged(
        node=node,
        device=device,
        health="Unhealthy" if error_type else "Healthy",
        error_type=error_type,
        severity=severity,
        observed_at=at,
    )


def test_severity_chooses_the_effect() -> None:
    degraded = taint_of(health("neurondevice1", "HBM_REPAIRABLE_ERROR", "degraded"))
    assert degraded is not None
    assert taint_json(degraded) == {
        "key": HARDWARE_ERROR_KEY,
        "value": "HBM_REPAIRABLE_ERROR",
        "effect": "NoSchedule",
    }
    bad = taint_of(health("neurondevice1", "SRAM_UNCORRECTABLE_ERROR", "uncorrectable"))
    assert bad is not None
    assert bad.effect == "NoExecute"
    assert taint_of(health("neurondevice1")) is None


def test_a_redelivered_older_event_does_not_undo_a_newer_one() -> None:
    taints = HealthTaints()
    assert taints.apply(health("neurondevice2", "DMA_ERROR", "uncorrectable", at=T0))
    assert not taints.apply(health("neurondevice2", at=T0 - timedelta(seconds=5)))
    assert taints.for_node("n1", ["neurondevice2"])["neurondevice2"][0].value == "DMA_ERROR"
    assert taints.apply(health("neurondevice2", at=T0 + timedelta(seconds=5)))
    assert taints.for_node("n1", ["neurondevice2"]) == {}
    # Nor does an older error undo the newer repair.
    assert not taints.apply(health("neurondevice2", "DMA_ERROR", "uncorrectable", at=T0))
    assert taints.for_node("n1", ["neurondevice2"]) == {}


def test_a_lost_node_taints_every_device_and_the_node_device_takes_the_worst_chip() -> None:
    taints = HealthTaints()
    taints.apply(health("neurondevice0", "NEURONLINK_DOWN", "degraded"))
    names = ["neurondevice0", "neurondevice1", "neuronnode"]
    got = taints.for_node("n1", names)
    assert {n: [t.effect for t in ts] for n, ts in got.items()} == {
        "neurondevice0": ["NoSchedule"],
        "neuronnode": ["NoSchedule"],
    }
    assert taints.set_lost("n1", True)
    assert not taints.set_lost("n1", True)
    got = taints.for_node("n1", names)
    assert all("neuron.aws.com/node-lost" in {t.key for t in got[n]} for n in names)
    assert taints.set_lost("n1", False)


def test_build_pool_taints_devices_or_leaves_them_out() -> None:
    hw = hardware("trn2.48xlarge")
    taint = {"key": HARDWARE_ERROR_KEY, "value": "DMA_ERROR", "effect": "NoExecute"}
    pool = build_pool(
        node="n1",
        hardware=hw,
        labels={},
        mode=NodeDeviceMode.COUNTERS,
        dra_driver_version="0.1.0",
        taints={"neurondevice3": [taint]},
    )
    devices = {d["name"]: d for s in pool.slices for d in s.devices}
    assert len(devices) == 16  # the device stays listed
    assert devices["neurondevice3"]["taints"] == [taint]
    assert all("taints" not in d for n, d in devices.items() if n != "neurondevice3")
    hidden = build_pool(
        node="n1",
        hardware=hw,
        labels={},
        mode=NodeDeviceMode.COUNTERS,
        dra_driver_version="0.1.0",
        taints={"neurondevice3": [taint]},
        hide_tainted=True,
    )
    assert "neurondevice3" not in hidden.device_names
    assert len(hidden.device_names) == 15
    assert not any("taints" in d for s in hidden.slices for d in s.devices)


@pytest.fixture
async def world() -> AsyncIterator[World]:
    w = World()
    task = asyncio.create_task(
        run_workers(w.controller.queue, w.controller.reconcile, workers=2), name="workers"
    )
    try:
        yield w
    finally:
        w.controller.queue.shutdown()
        await asyncio.wait_for(task, 5)


def _device(world: World, node: str, name: str) -> dict[str, Any] | None:
    for obj in world.pool(node):
        for d in obj["spec"].get("devices") or []:
            if d["name"] == name:
                return dict(d)
    return None


async def test_health_events_taint_and_untaint_the_stored_pool(world: World) -> None:
    world.add_node("n1")
    world.controller.accept(inventory("n1"))
    await world.settle()
    generation = world.controller.generations["n1"]
    world.controller.accept_health(
        health("neurondevice5", "NC_UNCORRECTABLE_ERROR", "uncorrectable")
    )
    await world.settle()
    device = _device(world, "n1", "neurondevice5")
    assert device is not None
    assert device["taints"] == [
        {"key": HARDWARE_ERROR_KEY, "value": "NC_UNCORRECTABLE_ERROR", "effect": "NoExecute"}
    ]
    assert world.controller.generations["n1"] == generation + 1
    # The same news again writes nothing.
    assert not world.controller.accept_health(
        health("neurondevice5", "NC_UNCORRECTABLE_ERROR", "uncorrectable")
    )
    world.controller.accept_health(health("neurondevice5", at=T0 + timedelta(seconds=1)))
    await world.settle()
    device = _device(world, "n1", "neurondevice5")
    assert device is not None
    assert "taints" not in device


async def test_without_served_taints_the_device_leaves_the_pool_until_repaired() -> None:
    store = MemorySliceStore()
    controller = Controller(
        store=store,
        nodes=_info,
        mode=NodeDeviceMode.NODE_ONLY,
        dra_driver_version="0.1.0",
        taints_served=False,
    )
    task = asyncio.create_task(run_workers(controller.queue, controller.reconcile, workers=1))
    try:
        controller.accept(inventory("n1"))
        controller.accept_health(
            health("neurondevice2", "HBM_UNCORRECTABLE_ERROR", "uncorrectable")
        )
        for _ in range(200):
            await asyncio.sleep(0.01)
            names = {d["name"] for o in store.objects.values() for d in o["spec"]["devices"]}
            if names and "neurondevice2" not in names:
                break
        assert "neurondevice2" not in names
        assert len(names) == 15
        controller.accept_health(health("neurondevice2", at=T0 + timedelta(seconds=1)))
        for _ in range(200):
            await asyncio.sleep(0.01)
            names = {d["name"] for o in store.objects.values() for d in o["spec"]["devices"]}
            if "neurondevice2" in names:
                break
        assert len(names) == 16
    finally:
        controller.queue.shutdown()
        await asyncio.wait_for(task, 5)


def _info(name: str) -> NodeInfo:
    return NodeInfo(name=name, uid="uid", labels={})


class _Lost(Event, frozen=True, kw_only=True, tag="node.lost.v1"):
    """The failure detector's verdict, in the shape the event contract gives it."""

    node: str
    detected_at: datetime
    reason: str = ""


class _Recovered(Event, frozen=True, kw_only=True, tag="node.recovered.v1"):
    node: str
    detected_at: datetime
    lost_for_seconds: float = 0.0


async def test_a_lost_node_taints_every_device_noexecute_until_it_recovers(world: World) -> None:
    world.add_node("n1")
    world.controller.accept(inventory("n1"))
    await world.settle()
    assert world.controller.accept_health(_Lost(node="n1", detected_at=T0))  # type: ignore[arg-type]
    await world.settle()
    for index in range(16):
        device = _device(world, "n1", f"neurondevice{index}")
        assert device is not None
        assert device["taints"] == [
            {"key": "neuron.aws.com/node-lost", "value": "true", "effect": "NoExecute"}
        ]
    recovered = _Recovered(node="n1", detected_at=T0)
    assert world.controller.accept_health(recovered)  # type: ignore[arg-type]
    await world.settle()
    device = _device(world, "n1", "neurondevice0")
    assert device is not None
    assert "taints" not in device


class Reports:
    """What the controller reported on the bus; ``failures`` publishes fail first."""

    def __init__(self, failures: int = 0) -> None:
        self.sent: list[tuple[DeviceTaintChanged, str]] = []
        self.tried: list[str] = []
        self.failures = failures

    async def publish(self, event: DeviceTaintChanged, msg_id: str) -> None:
        self.tried.append(msg_id)
        if self.failures:
            self.failures -= 1
            raise ConnectionError("nats: no responders")
        self.sent.append((event, msg_id))

    def summary(self) -> list[tuple[str, list[tuple[str, str, str]], list[str]]]:
        return [
            (
                e.device,
                [(t.key, t.value, t.effect) for t in e.taints],
                [t.value for t in e.previous],
            )
            for e, _ in self.sent
        ]


async def test_each_taint_change_is_reported_once_with_its_reason(world: World) -> None:
    reports = Reports()
    world.controller.announcer = TaintAnnouncer(reports.publish)
    world.add_node("n1")
    world.controller.accept(inventory("n1"))
    await world.settle()
    assert reports.sent == []  # a healthy node has nothing to report
    bad = health("neurondevice5", "DMA_ERROR", "uncorrectable")
    world.controller.accept_health(msgspec.structs.replace(bad, evidence="NEURON_HW_ERR=DMA_ERROR"))
    await world.settle()
    set_ = [(HARDWARE_ERROR_KEY, "DMA_ERROR", "NoExecute")]
    # The chip and the whole-node device, each once, with why.
    assert reports.summary() == [("neurondevice5", set_, []), ("neuronnode", set_, [])]
    chip = reports.sent[0][0]
    assert chip.reason == "DMA_ERROR uncorrectable: NEURON_HW_ERR=DMA_ERROR"
    assert chip.pool_generation == world.controller.generations["n1"]
    assert "neurondevice5: DMA_ERROR" in reports.sent[1][0].reason
    # Another write of the pool (new labels) reports nothing new.
    world.nodes["n1"] = NodeInfo(name="n1", uid="uid", labels={"team": "ml"})
    world.controller.node_changed("MODIFIED", {"metadata": {"name": "n1"}})
    await world.settle()
    assert len(reports.sent) == 2
    world.controller.accept_health(health("neurondevice5", at=T0 + timedelta(seconds=1)))
    await world.settle()
    assert reports.summary()[2:] == [
        ("neurondevice5", [], ["DMA_ERROR"]),
        ("neuronnode", [], ["DMA_ERROR"]),
    ]
    assert reports.sent[2][0].reason == "healthy again"
    assert len({msg_id for _, msg_id in reports.sent}) == 4


async def test_a_lost_node_is_the_reason_and_a_failed_report_is_sent_again_once(
    world: World,
) -> None:
    reports = Reports(failures=1)
    world.controller.announcer = TaintAnnouncer(reports.publish)
    world.add_node("n1")
    world.controller.accept(inventory("n1"))
    await world.settle()
    lost = NodeLost(node="n1", detected_at=T0, reason="no heartbeat for 3.0 s")
    world.controller.accept_health(lost)
    for _ in range(300):
        if len(reports.sent) == 17:
            break
        await asyncio.sleep(0.01)
    await world.settle()
    assert len(reports.sent) == 17  # 16 chips and the node device
    assert {e.reason for e, _ in reports.sent} == {
        "node declared lost by the failure detector: no heartbeat for 3.0 s"
    }
    # The failed publish was tried again under the same id (JetStream keeps one).
    assert reports.tried[0] == reports.tried[1]
    # A publisher started again with what was reported repeats nothing.
    again = TaintAnnouncer(reports.publish)
    for event, _ in reports.sent:
        again.seed(event)
    taints = dict(world.controller._taints(world.controller.inventories["n1"]))
    assert again.changes("n1", taints, health=world.controller.health, generation=9) == []
