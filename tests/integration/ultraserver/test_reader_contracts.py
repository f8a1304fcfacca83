"""The reader contract run against the topology allocator's three projection readers and the
UltraServer operator's health reader, each as the service builds it: malformed messages are
dead letters with their reason (they used to be logged and skipped), once, and the reader goes
on."""

from __future__ import annotations

from datetime import UTC, datetime

from neuron_dra_common.bus import Bus, Follower
from neuron_dra_common.events import (
    AllocationDecided,
    AnyEvent,
    DeviceHealthChanged,
    Event,
    NodeInventory,
    ObjectRef,
)
from neuron_dra_common.hardware.model import NeuronDevice, NodeHardware
from neuron_dra_topology_allocator.main import projection_followers
from neuron_dra_topology_allocator.projection import Projection
from neuron_dra_ultraserver_operator.health import NodeHealth
from neuron_dra_ultraserver_operator.main import health_reader

from tests.contracts.reader import ReaderContract


class RecordingProjection(Projection):
    """The allocator's projection, remembering each event it applied."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[AnyEvent] = []

    def apply(self, event: AnyEvent) -> None:
        super().apply(event)
        self.seen.append(event)


def uncorrectable(node: str) -> DeviceHealthChanged:
    return DeviceHealthChanged(
        node=node,
        device="neurondevice3",
        health="Unhealthy",
        severity="uncorrectable",
        observed_at=datetime(2026, 11, 25, 12, 0, tzinfo=UTC),
    )


class AllocatorReader(ReaderContract):
    kind: str
    projection: RecordingProjection

    def make_reader(self, bus: Bus) -> Follower:
        self.projection = RecordingProjection()
        reader = projection_followers(bus, self.projection)[self.kind]
        assert reader.name == f"topology-allocator-{self.kind}"
        return reader

    async def effect_count(self, event: Event) -> int:
        return self.projection.seen.count(event)  # type: ignore[arg-type]


class TestAllocatorInventoryReader(AllocatorReader):
    kind = "inventory"

    def sample_event(self, index: int) -> Event:
        return NodeInventory(
            node=f"contract-node-{index}",
            boot_id="boot",
            generation=1,
            hardware=NodeHardware(
                instance_type="trn2.48xlarge",
                driver_version="2.24.7.0",
                devices=tuple(NeuronDevice(index=i) for i in range(16)),
            ),
        )


class TestAllocatorHealthReader(AllocatorReader):
    kind = "health"

    def sample_event(self, index: int) -> Event:
        return uncorrectable(f"contract-node-{index}")


class TestAllocatorAllocationsReader(AllocatorReader):
    kind = "allocations"

    def sample_event(self, index: int) -> Event:
        return AllocationDecided(
            request_id=f"r{index}",
            workload=ObjectRef(namespace="default", name=f"train-{index}", uid=f"uid-{index}"),
            granted=False,
            reason="no UltraServer of 4 nodes is free",
        )


class TestOperatorHealthReader(ReaderContract):
    failed: list[str]

    def sample_event(self, index: int) -> Event:
        return uncorrectable(f"contract-node-{index}")

    def make_reader(self, bus: Bus) -> Follower:
        self.failed = []

        def changed(node: str, failed: bool) -> None:
            if failed:
                self.failed.append(node)

        reader = health_reader(bus, NodeHealth(changed))
        assert reader.name == "ultraserver-operator-health"
        return reader

    async def effect_count(self, event: Event) -> int:
        assert isinstance(event, DeviceHealthChanged)
        return self.failed.count(event.node)
