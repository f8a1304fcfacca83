"""Sharing the nodes between publishers: which buckets, consumers and Leases each share has,
and a share's publisher leaving other shares' nodes alone."""

from __future__ import annotations

import asyncio

import pytest
from neuron_dra_common.bus.declarations import (
    INVENTORY,
    INVENTORY_BUCKETS,
    PUBLISHER_SHARES,
    inventory_partition,
    share_consumers,
)
from neuron_dra_common.kube import run_workers
from neuron_dra_common.settings import SettingsError, load
from neuron_dra_slice_publisher.controller import Controller, NodeInfo
from neuron_dra_slice_publisher.partitions import lease_names, other_leases
from neuron_dra_slice_publisher.settings import SlicePublisherSettings
from neuron_dra_slice_publisher.slices import NodeDeviceMode
from neuron_dra_slice_publisher.store import MemorySliceStore

from tests.unit.slices.test_controller import inventory


@pytest.mark.parametrize("partitions", range(1, PUBLISHER_SHARES + 1))
def test_the_shares_cover_every_bucket_once(partitions: int) -> None:
    subjects = [s for p in range(partitions) for s in inventory_partition(p, partitions)]
    if partitions == 1:
        assert subjects == list(INVENTORY.subjects)
        return
    assert sorted(subjects) == sorted(f"neuron.inventory.{b}.*" for b in range(INVENTORY_BUCKETS))
    sizes = {len(inventory_partition(p, partitions)) for p in range(partitions)}
    assert max(sizes) - min(sizes) <= 1


def test_the_stream_files_inventories_in_the_buckets_the_shares_read() -> None:
    assert INVENTORY.subject_transform == (
        "neuron.inventory.*",
        f"neuron.inventory.{{{{partition({INVENTORY_BUCKETS},1)}}}}.{{{{wildcard(1)}}}}",
    )


def test_a_share_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="partition 2 of 2"):
        inventory_partition(2, 2)


def test_one_share_keeps_todays_consumers_and_lease() -> None:
    [(inv, health)] = share_consumers(1)
    assert (inv.durable, health.durable) == ("slice-publisher-inventory", "slice-publisher-health")
    assert inv.filter_subjects == ()
    assert lease_names("neuron-dra-slice-publisher", 1) == ["neuron-dra-slice-publisher"]


def test_each_share_has_its_own_consumers_and_lease() -> None:
    pairs = share_consumers(2)
    assert [(i.durable, h.durable) for i, h in pairs] == [
        ("slice-publisher-inventory-0", "slice-publisher-health-0"),
        ("slice-publisher-inventory-1", "slice-publisher-health-1"),
    ]
    assert pairs[1][0].filter_subjects == inventory_partition(1, 2)
    assert lease_names("p", 2) == ["p-0-of-2", "p-1-of-2"]
    assert "p" in other_leases("p", 2)
    assert not set(lease_names("p", 2)) & set(other_leases("p", 2))


def test_more_shares_than_allowed_name_the_setting() -> None:
    with pytest.raises(SettingsError, match="NEURON_DRA_PARTITIONS"):
        load(
            SlicePublisherSettings,
            argv=[],
            environ={"NEURON_DRA_PARTITIONS": str(PUBLISHER_SHARES + 1)},
        )


async def test_a_share_writes_only_the_nodes_whose_inventory_it_consumed() -> None:
    store = MemorySliceStore()
    nodes = {n: NodeInfo(name=n, uid="uid", labels={}) for n in ("mine", "theirs")}
    controller = Controller(
        store=store,
        nodes=nodes.get,
        mode=NodeDeviceMode.COUNTERS,
        dra_driver_version="0.1.0",
        partitioned=True,
    )
    workers = asyncio.create_task(run_workers(controller.queue, controller.reconcile, workers=2))
    try:
        controller.accept(inventory("mine"))
        # The other share's node changes (its Node, its health): queued here too, not written.
        controller.node_changed("MODIFIED", {"metadata": {"name": "theirs"}})
        for _ in range(200):
            if store.objects and not len(controller.queue):
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
    finally:
        controller.queue.shutdown()
        await asyncio.wait_for(workers, 5)
    assert {o["spec"]["nodeName"] for o in store.objects.values()} == {"mine"}
