"""On the local stack: a device fault on the bus is an alert in the stack's Alertmanager, a
line in the audit file and a row of ``neuron-dra events``; the repair resolves the alert."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from typing import Any

import pytest
from neuron_dra_cli.stack import alerting
from neuron_dra_common.bus import Bus
from neuron_dra_common.events import DeviceHealthChanged

from tests.fixtures.stack import KubeStack, neuron_dra

pytestmark = pytest.mark.stack


def active_alerts(url: str, device: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{url}/api/v2/alerts?active=true", timeout=5) as r:
        found: list[dict[str, Any]] = json.load(r)
    return [a for a in found if a["labels"].get("device") == device]


def wait_for(probe: Any, what: str, within: float = 30) -> Any:
    deadline = time.monotonic() + within
    while not (found := probe()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)
    return found


async def publish(stack: KubeStack, event: DeviceHealthChanged) -> str:
    bus = await Bus.connect(
        [stack.nats_url], name="test-fault", credentials=stack.bus_credentials()
    )
    try:
        return (await bus.publisher(source="/test/health").publish(event)).msg_id
    finally:
        await bus.close()


def test_a_device_fault_is_alerted_audited_and_resolved(kube_stack: KubeStack) -> None:
    state = json.loads((kube_stack.state_dir / "state.json").read_text())
    [am] = [c for c in state["components"] if c["kind"] == alerting.ALERTMANAGER]
    assert {c["kind"] for c in state["components"]} >= {"audit", "alerts"}
    url = alerting.ui_url(am["ports"]).rstrip("/")
    node, device = "trn2-48xl-1", "neurondevice7"
    fault = DeviceHealthChanged(
        node=node,
        device=device,
        health="Unhealthy",
        previous="Healthy",
        error_type="HBM_UNCORRECTABLE_ERROR",
        severity="uncorrectable",
        action="replace-instance",
    )
    fault_id = asyncio.run(publish(kube_stack, fault))
    [alert] = wait_for(lambda: active_alerts(url, device), "the alert in Alertmanager")
    assert alert["labels"]["node"] == node
    assert alert["labels"]["severity"] == "critical"

    audit = alerting.audit_file(kube_stack.state_dir)
    line = wait_for(
        lambda: [x for x in audit.read_text().splitlines() if fault_id in x], "the audit line"
    )[0]
    assert json.loads(line)["type"] == "com.aws.neuron.device.health.v1"

    shown = neuron_dra(
        "events",
        "--state-dir",
        str(kube_stack.state_dir),
        "--node",
        node,
        "--since",
        "10m",
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert any(
        device in row and "HBM_UNCORRECTABLE_ERROR" in row for row in shown.stdout.splitlines()
    )
    assert any("firing NeuronDeviceUnhealthy" in row for row in shown.stdout.splitlines())

    repair = DeviceHealthChanged(node=node, device=device, health="Healthy", previous="Unhealthy")
    asyncio.run(publish(kube_stack, repair))
    wait_for(lambda: not active_alerts(url, device), "the alert resolved")
