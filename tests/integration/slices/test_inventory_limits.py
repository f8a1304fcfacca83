"""An inventory with more devices than a host can have makes no ResourceSlices: the slice
publisher's start-up read and its consumer both refuse it with one dead letter (a 5,000-device
inventory used to become 40 slices)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from neuron_dra_common.bus import Bus, consumer
from neuron_dra_common.events import NodeInventory
from neuron_dra_common.hardware.model import NeuronDevice, NodeHardware
from neuron_dra_common.kube import run_workers
from neuron_dra_slice_publisher.controller import Controller, NodeInfo
from neuron_dra_slice_publisher.pool import slice_name
from neuron_dra_slice_publisher.slices import NodeDeviceMode
from neuron_dra_slice_publisher.store import MemorySliceStore
from neuron_dra_slice_publisher.wiring import INVENTORY_DURABLE, read_inventories

from tests.contracts.support import dead_letters, running, wait_until


def inventory(node: str, devices: int) -> NodeInventory:
    return NodeInventory(
        node=node,
        boot_id="boot",
        generation=1,
        hardware=NodeHardware(
            instance_type="trn2.48xlarge",
            driver_version="2.24.7.0",
            devices=tuple(NeuronDevice(index=i) for i in range(devices)),
        ),
    )


@pytest.fixture
async def controller() -> AsyncIterator[Controller]:
    controller = Controller(
        store=MemorySliceStore(),
        nodes=lambda name: NodeInfo(name=name, uid=f"uid-{name}"),
        mode=NodeDeviceMode.COUNTERS,
        dra_driver_version="0.1.0",
    )
    task = asyncio.create_task(
        run_workers(controller.queue, controller.reconcile, workers=2), name="pool-workers"
    )
    yield controller
    controller.queue.shutdown()
    await asyncio.wait_for(task, 5)


async def test_an_inventory_over_the_device_limit_makes_no_slices(
    nats_bus: Bus, controller: Controller
) -> None:
    # 1,000 devices: as many as one message can carry under NATS's default max_payload.
    crowded, good = inventory("crowded", 1000), inventory("good", 16)
    publisher = nats_bus.publisher(source="/test")
    await publisher.publish(crowded)
    await publisher.publish(good)

    assert [i.node for i in await read_inventories(nats_bus)] == ["good"]
    [record] = await dead_letters(nats_bus)
    assert record.consumer == INVENTORY_DURABLE
    assert record.reason == (
        "NodeInventory crowded: hardware.devices has 1000 devices, over the limit of 64"
    )

    store = controller.store
    assert isinstance(store, MemorySliceStore)
    runner = nats_bus.runner(consumer(INVENTORY_DURABLE), controller.handle)
    async with running(runner):
        await wait_until(lambda: slice_name("good", 0) in store.objects, what="good's slice")
    assert [name for name in store.objects if "crowded" in name] == []
    # The consumer refused the same stored message: still one dead letter.
    assert len(await dead_letters(nats_bus)) == 1
