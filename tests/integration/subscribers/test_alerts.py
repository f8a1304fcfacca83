"""The alerts service as a process against a real NATS and a real Alertmanager: an unhealthy
device fires an alert a user sees in Alertmanager's API, with its labels; healthy again
resolves it; kill -9 mid-incident neither loses a firing alert nor fires a resolved one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from neuron_dra_cli.stack import alerting
from neuron_dra_common.bus import Bus, replay
from neuron_dra_common.bus.declarations import AUDIT
from neuron_dra_common.events import (
    AlertStateChanged,
    DeviceHealthChanged,
    NodeLost,
    NodeRecovered,
)

from tests.fixtures.nats import NatsServer
from tests.fixtures.subscribers import Alertmanager, ServiceProcess


@pytest.fixture
def alerts(
    nats_server: NatsServer, alertmanager: Alertmanager, tmp_path: Path
) -> Iterator[ServiceProcess]:
    [_, component] = alerting.subscriber_components(
        nats_url=nats_server.url, state_dir=tmp_path, alertmanager_url=alertmanager.url
    )
    component.env.update(nats_server.open_env)
    service = ServiceProcess(component, log=tmp_path / "alerts.log")
    try:
        yield service
    finally:
        service.stop()


async def eventually(
    probe: Callable[[], Any], *, within: float = 30, what: str = "condition"
) -> Any:
    deadline = time.monotonic() + within
    while True:
        found = await asyncio.to_thread(probe)
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(0.2)


def device(node: str, dev: str, health: str, **extra: Any) -> DeviceHealthChanged:
    return DeviceHealthChanged(node=node, device=dev, health=health, **extra)  # type: ignore[arg-type]


def uncorrectable(node: str, dev: str) -> DeviceHealthChanged:
    return device(
        node,
        dev,
        "Unhealthy",
        previous="Healthy",
        error_type="NC_UNCORRECTABLE_ERROR",
        severity="uncorrectable",
        action="replace-instance",
        evidence="NEURON_HW_ERR=NC_UNCORRECTABLE_ERROR nd-id=3 nc-id=1",
        core=1,
    )


async def recorded(bus: Bus, key: str) -> list[AlertStateChanged]:
    """Every change of alert ``key`` the audit stream holds, in order."""
    events = await replay(bus, name="test-reader", stream=AUDIT.name, subject="neuron.alert.>")
    return [e for e in events if isinstance(e, AlertStateChanged) and e.key == key]


async def test_unhealthy_device_fires_with_its_labels_and_healthy_resolves(
    nats_bus: Bus, alerts: ServiceProcess, alertmanager: Alertmanager
) -> None:
    alerts.start()
    publisher = nats_bus.publisher(source="/test/health-monitor")
    await publisher.publish(uncorrectable("trn2-a", "neurondevice3"))
    [alert] = await eventually(
        lambda: alertmanager.active(alertname="NeuronDeviceUnhealthy", device="neurondevice3"),
        what="the alert in Alertmanager",
    )
    assert alert["labels"] == {
        "alertname": "NeuronDeviceUnhealthy",
        "severity": "critical",
        "node": "trn2-a",
        "device": "neurondevice3",
    }
    assert "NC_UNCORRECTABLE_ERROR" in alert["annotations"]["summary"]
    assert "replace the instance" in alert["annotations"]["runbook"]
    assert "nc-id=1" in alert["annotations"]["description"]

    await publisher.publish(device("trn2-a", "neurondevice3", "Healthy", previous="Unhealthy"))
    await eventually(
        lambda: not alertmanager.active(alertname="NeuronDeviceUnhealthy"),
        what="the alert resolved",
    )
    changes = await recorded(nats_bus, "NeuronDeviceUnhealthy/trn2-a/neurondevice3")
    assert [c.status for c in changes] == ["firing", "resolved"]


async def test_node_lost_fires_and_recovered_resolves(
    nats_bus: Bus, alerts: ServiceProcess, alertmanager: Alertmanager
) -> None:
    from datetime import UTC, datetime

    alerts.start()
    publisher = nats_bus.publisher(source="/test/detector")
    now = datetime.now(UTC)
    await publisher.publish(
        NodeLost(node="trn2-b", last_heartbeat_at=now, detected_at=now, reason="no heartbeat")
    )
    [alert] = await eventually(
        lambda: alertmanager.active(alertname="NeuronNodeLost", node="trn2-b"),
        what="the node-lost alert",
    )
    assert alert["labels"]["severity"] == "critical"
    await publisher.publish(NodeRecovered(node="trn2-b", detected_at=now, lost_for_seconds=4.0))
    await eventually(
        lambda: not alertmanager.active(alertname="NeuronNodeLost"), what="node alert resolved"
    )


async def test_kill9_mid_incident_loses_nothing_and_repeats_nothing(
    nats_bus: Bus, alerts: ServiceProcess, alertmanager: Alertmanager
) -> None:
    publisher = nats_bus.publisher(source="/test/health-monitor")
    alerts.start()
    await publisher.publish(uncorrectable("trn2-a", "neurondevice1"))
    [first] = await eventually(
        lambda: alertmanager.active(device="neurondevice1"), what="first alert"
    )
    # Killed while the incident goes on; more happens while it is down.
    alerts.kill9()
    await publisher.publish(uncorrectable("trn2-a", "neurondevice2"))
    await publisher.publish(device("trn2-a", "neurondevice1", "Healthy", previous="Unhealthy"))
    alerts.start()
    await eventually(lambda: alertmanager.active(device="neurondevice2"), what="missed alert")
    await eventually(lambda: not alertmanager.active(device="neurondevice1"), what="resolved")
    # Now die between sending a new alert and acknowledging its event, and resolve it while
    # the service is down: the firing event comes back after the restart, behind its
    # resolution, and must not fire the alert again.
    alerts.stop()
    alerts.start(env={"NEURON_DRA_ALERTS_CRASH_AT": "after-send"})
    await publisher.publish(uncorrectable("trn2-a", "neurondevice3"))
    assert await asyncio.to_thread(alerts.wait_exit) == -9
    await publisher.publish(device("trn2-a", "neurondevice3", "Healthy", previous="Unhealthy"))
    alerts.start()
    # The unacknowledged event is delivered again once the ack wait (30 s) has passed, and
    # acknowledged by the restarted service.
    deadline = time.monotonic() + 90
    while True:
        info = await nats_bus.js.consumer_info(AUDIT.name, "alert")
        if info.num_redelivered == 0 and info.num_ack_pending == 0 and info.num_pending == 0:
            break
        assert time.monotonic() < deadline, f"alert consumer never caught up: {info}"
        await asyncio.sleep(0.5)
    assert info.num_redelivered == 0
    assert alertmanager.active(device="neurondevice3") == []
    assert alertmanager.active(device="neurondevice1") == []
    [still] = alertmanager.active(device="neurondevice2")
    assert still["startsAt"] != first["startsAt"]
    for dev, statuses in (
        ("neurondevice1", ["firing", "resolved"]),
        ("neurondevice2", ["firing"]),
        ("neurondevice3", ["firing", "resolved"]),
    ):
        changes = await recorded(nats_bus, f"NeuronDeviceUnhealthy/trn2-a/{dev}")
        assert [c.status for c in changes] == statuses, dev
