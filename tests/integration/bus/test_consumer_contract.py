"""The consumer contract run against a small idempotent consumer built on the bus alone.

It is the reference for services: state keyed by what the event is about, applied only when
the stream sequence is newer than the last one applied for that key.
"""

from __future__ import annotations

from neuron_dra_common.bus import Bus, ConsumerSpec, Delivery, Handler
from neuron_dra_common.bus.declarations import HEALTH
from neuron_dra_common.events import AnyEvent, DeviceHealthChanged, Event

from tests.contracts.consumer import ConsumerContract


class DeviceHealthTable:
    """Latest health per device, plus a log of every change it applied."""

    def __init__(self) -> None:
        self.last_sequence: dict[tuple[str, str], int] = {}
        self.applied: list[DeviceHealthChanged] = []

    async def handle(self, event: AnyEvent, delivery: Delivery) -> None:
        if not isinstance(event, DeviceHealthChanged):
            return
        key = (event.node, event.device)
        if delivery.stream_sequence <= self.last_sequence.get(key, 0):
            return
        self.applied.append(event)
        self.last_sequence[key] = delivery.stream_sequence


class TestDeviceHealthTable(ConsumerContract):
    spec = ConsumerSpec(stream=HEALTH.name, durable="contract-health-table")

    table: DeviceHealthTable

    def sample_event(self, index: int) -> Event:
        return DeviceHealthChanged(
            node="ip-10-0-0-1.ec2.internal", device=f"neurondevice{index}", health="Unhealthy"
        )

    async def make_handler(self, bus: Bus) -> Handler:
        # pytest makes a new instance per test, so each test starts with an empty table.
        self.table = DeviceHealthTable()
        return self.table.handle

    async def effect_count(self, event: Event) -> int:
        return self.table.applied.count(event)  # type: ignore[arg-type]
