"""The shared consumer contract, run against the slice publisher's real inventory handler
(with its real controller and work queue, writing to an in-memory slice store)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from neuron_dra_common.bus import Bus, Handler, consumer
from neuron_dra_common.events import Event, NodeInventory
from neuron_dra_common.hardware.model import NeuronDevice, NodeHardware
from neuron_dra_common.kube import run_workers
from neuron_dra_slice_publisher.controller import Controller, NodeInfo
from neuron_dra_slice_publisher.pool import slice_name
from neuron_dra_slice_publisher.slices import NodeDeviceMode
from neuron_dra_slice_publisher.store import MemorySliceStore

from tests.contracts.consumer import ConsumerContract


class TestSlicePublisherInventory(ConsumerContract):
    spec = consumer("slice-publisher-inventory")

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
        yield
        self.controller.queue.shutdown()
        await asyncio.wait_for(task, 5)

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

    async def make_handler(self, bus: Bus) -> Handler:
        return self.controller.handle

    async def effect_count(self, event: Event) -> int:
        assert isinstance(event, NodeInventory)
        return self.store.writes.get(slice_name(event.node, 0), 0)
