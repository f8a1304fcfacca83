"""The shared consumer contract, run against the slice publisher's real health handler: a
health event taints the device on the node's pool exactly once, whatever the redeliveries."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from neuron_dra_common.bus import Bus, Handler, consumer
from neuron_dra_common.events import DeviceHealthChanged, Event, NodeInventory
from neuron_dra_common.hardware.model import NeuronDevice, NodeHardware
from neuron_dra_common.kube import run_workers
from neuron_dra_slice_publisher.controller import Controller, NodeInfo
from neuron_dra_slice_publisher.pool import slice_name
from neuron_dra_slice_publisher.slices import NodeDeviceMode
from neuron_dra_slice_publisher.store import MemorySliceStore

from tests.contracts.consumer import ConsumerContract

NODES = 4


class TestSlicePublisherHealth(ConsumerContract):
    fuzz_good = tuple(range(NODES))  # the nodes whose inventories the publisher holds
    spec = consumer("slice-publisher-health")

    @pytest.fixture(autouse=True)
    async def _workers(self) -> AsyncIterator[None]:
        self.store = MemorySliceStore()
        self.controller = Controller(
            store=self.store,
            nodes=lambda name: NodeInfo(name=name, uid=f"uid-{name}"),
            mode=NodeDeviceMode.COUNTERS,
            dra_driver_version="0.1.0",
        )
        task = asyncio.create_task(
            run_workers(self.controller.queue, self.controller.reconcile, workers=2),
            name="pool-workers",
        )
        for index in range(NODES):
            self.controller.accept(
                NodeInventory(
                    node=f"contract-node-{index}",
                    boot_id="boot",
                    generation=1,
                    hardware=NodeHardware(
                        instance_type="trn2.48xlarge",
                        driver_version="2.24.7.0",
                        devices=tuple(NeuronDevice(index=i) for i in range(16)),
                    ),
                )
            )
        for _ in range(500):
            if all(self.store.writes.get(self._slice(i)) == 1 for i in range(NODES)):
                break
            await asyncio.sleep(0.01)
        yield
        self.controller.queue.shutdown()
        await asyncio.wait_for(task, 5)

    @staticmethod
    def _slice(index: int) -> str:
        # A trn2.48xlarge pool is one slice of 16 devices.
        return slice_name(f"contract-node-{index}", 0)

    def sample_event(self, index: int) -> Event:
        return DeviceHealthChanged(
            node=f"contract-node-{index}",
            device="neurondevice3",
            health="Unhealthy",
            error_type="DMA_ERROR",
            severity="uncorrectable",
            observed_at=datetime(2026, 11, 25, 12, 0, tzinfo=UTC),
        )

    async def make_handler(self, bus: Bus) -> Handler:
        return self.controller.handle_health

    async def effect_count(self, event: Event) -> int:
        assert isinstance(event, DeviceHealthChanged)
        index = int(event.node.rsplit("-", 1)[1])
        stored = self.store.objects.get(self._slice(index))
        tainted = stored is not None and any(
            d.get("taints") for d in stored["spec"].get("devices") or []
        )
        # The pool's first write came from the inventory; each tainting write after it counts.
        return self.store.writes.get(self._slice(index), 0) - 1 if tainted else 0
