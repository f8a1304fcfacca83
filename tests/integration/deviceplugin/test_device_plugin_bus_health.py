"""The device plugin's health from a real bus: the health monitor's events for this node make
its devices (and their cores) Unhealthy in the list the kubelet reads, a restart remembers
them, and a repair brings them back."""

from __future__ import annotations

import asyncio

from neuron_dra_common.bus import Bus
from neuron_dra_common.events import DeviceHealthChanged
from neuron_dra_device_plugin.bushealth import BusHealthFeed
from neuron_dra_device_plugin.health import HealthState
from neuron_dra_device_plugin.servicer import list_response

from tests.contracts.support import wait_until
from tests.unit.deviceplugin.helpers import inventory

INV = inventory("inf2.48xlarge")


def unhealthy_ids(state: HealthState, resource: str) -> list[str]:
    response = list_response(INV, resource=resource, unhealthy=state.unhealthy)
    return [d.ID for d in response.devices if d.health == "Unhealthy"]


async def test_health_events_of_this_node_mark_its_devices_and_cores_unhealthy(
    nats_bus: Bus,
) -> None:
    pub = nats_bus.publisher(source="/test")
    await pub.publish_many(
        [
            DeviceHealthChanged(
                node="n1", device="neurondevice4", health="Unhealthy", severity="uncorrectable"
            ),
            DeviceHealthChanged(node="n1", device="neurondevice2", health="Unhealthy"),
            DeviceHealthChanged(node="n1", device="neurondevice2", health="Healthy"),
            # Another node's device, and a device this node does not have.
            DeviceHealthChanged(node="n2", device="neurondevice5", health="Unhealthy"),
            DeviceHealthChanged(node="n1", device="neurondevice40", health="Unhealthy"),
        ]
    )
    # Started after the events: it replays the latest per device.
    state = HealthState()
    feed = BusHealthFeed(node="n1", devices=INV.devices, state=state)
    task = asyncio.create_task(feed.follow(nats_bus), name="bus-health")
    try:
        await wait_until(lambda: feed.applied == 2, what="the latest event per device")
        assert unhealthy_ids(state, "aws.amazon.com/neuron") == ["neuron4"]
        assert unhealthy_ids(state, "aws.amazon.com/neuroncore") == ["neuroncore8", "neuroncore9"]
        changed = state.next_change()
        await pub.publish(DeviceHealthChanged(node="n1", device="neurondevice4", health="Healthy"))
        await asyncio.wait_for(changed.wait(), 10)
        assert unhealthy_ids(state, "aws.amazon.com/neuron") == []
    finally:
        feed.stop()
        await asyncio.wait_for(task, 5)
