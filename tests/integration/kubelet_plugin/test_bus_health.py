"""The plugin's device health from a real bus: a restart remembers which devices are unhealthy."""

from __future__ import annotations

import asyncio

from neuron_dra_common.bus import Bus
from neuron_dra_common.events import DeviceHealthChanged
from neuron_dra_kubelet_plugin.bushealth import BusHealth
from neuron_dra_kubelet_plugin.health import Health

from tests.contracts.support import wait_until

DEVICES = ["neurondevice0", "neurondevice1"]


def states(health: BusHealth) -> dict[str, Health]:
    return {r.device: r.health for r in health.snapshot()}


async def test_a_started_plugin_sees_the_latest_health_of_its_devices_then_follows(
    nats_bus: Bus,
) -> None:
    pub = nats_bus.publisher(source="/test")
    await pub.publish_many(
        [
            DeviceHealthChanged(node="n1", device="neurondevice1", health="Unhealthy"),
            DeviceHealthChanged(node="n1", device="neurondevice0", health="Unhealthy"),
            DeviceHealthChanged(node="n1", device="neurondevice0", health="Healthy"),
            DeviceHealthChanged(node="n2", device="neurondevice0", health="Unhealthy"),
        ]
    )
    health = BusHealth(node="n1", pool="n1", devices=DEVICES)
    task = asyncio.create_task(health.follow(nats_bus), name="bus-health")
    try:
        await wait_until(lambda: health.applied == 2, what="the latest event per device")
        assert states(health) == {
            "neurondevice0": Health.HEALTHY,
            "neurondevice1": Health.UNHEALTHY,
        }
        await pub.publish(DeviceHealthChanged(node="n1", device="neurondevice1", health="Healthy"))
        await wait_until(lambda: states(health)["neurondevice1"] is Health.HEALTHY, what="recovery")
    finally:
        health.stop()
        await asyncio.wait_for(task, 5)
