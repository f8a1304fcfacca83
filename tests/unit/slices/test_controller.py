"""The publisher's reconcile against an in-memory store: one write per change, retries,
conflicts, vanished nodes, stale inventories."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest
from neuron_dra_common.bus import PermanentError
from neuron_dra_common.events import NodeInventory
from neuron_dra_common.hardware.model import (
    CoreStatus,
    Counter,
    EccCounters,
    NeuronDevice,
    NodeHardware,
)
from neuron_dra_common.kube import run_workers
from neuron_dra_common.telemetry import TRACEPARENT_ANNOTATION
from neuron_dra_common.ultraserver import NODE_ALLOCATION, NodeAllocation
from neuron_dra_slice_publisher import controller as controller_module
from neuron_dra_slice_publisher import slices as slices_module
from neuron_dra_slice_publisher.controller import Controller, NodeInfo
from neuron_dra_slice_publisher.leader import LeaseState, decide
from neuron_dra_slice_publisher.slices import NodeDeviceMode, PoolContent
from neuron_dra_slice_publisher.store import MemorySliceStore
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


def inventory(node: str, *, generation: int = 1, driver: str = "2.24.7.0") -> NodeInventory:
    return NodeInventory(
        node=node,
        boot_id="b",
        generation=generation,
        hardware=NodeHardware(
            instance_type="trn2.48xlarge",
            driver_version=driver,
            devices=tuple(NeuronDevice(index=i) for i in range(16)),
        ),
        dra_driver_version="0.1.0",
    )


class World:
    def __init__(self) -> None:
        self.store = MemorySliceStore()
        self.nodes: dict[str, NodeInfo] = {}
        self.controller = Controller(
            store=self.store,
            nodes=self.nodes.get,
            mode=NodeDeviceMode.COUNTERS,
            dra_driver_version="0.1.0",
        )

    def add_node(self, name: str, uid: str = "uid") -> None:
        self.nodes[name] = NodeInfo(name=name, uid=uid, labels={})

    def pool(self, node: str) -> list[dict[str, Any]]:
        return [o for o in self.store.objects.values() if o["spec"]["nodeName"] == node]

    async def settle(self) -> None:
        for _ in range(500):
            if not len(self.controller.queue) and not self.controller.queue._processing:
                await asyncio.sleep(0.01)
                if not len(self.controller.queue):
                    return
            await asyncio.sleep(0.005)
        raise AssertionError("queue did not settle")


@pytest.fixture
async def world() -> AsyncIterator[World]:
    w = World()
    task = asyncio.create_task(
        run_workers(w.controller.queue, w.controller.reconcile, workers=4), name="workers"
    )
    try:
        yield w
    finally:
        w.controller.queue.shutdown()
        await asyncio.wait_for(task, 5)


async def test_an_inventory_becomes_a_pool_written_once(world: World) -> None:
    world.add_node("n1")
    world.controller.accept(inventory("n1"))
    world.controller.accept(inventory("n1"))
    await world.settle()
    [obj] = world.pool("n1")
    assert obj["spec"]["pool"] == {"name": "n1", "generation": 1, "resourceSliceCount": 1}
    assert world.store.writes == {"n1-neuron.aws.com-0": 1}


async def test_a_change_bumps_the_generation(world: World) -> None:
    world.add_node("n1")
    world.controller.accept(inventory("n1"))
    await world.settle()
    world.controller.accept(inventory("n1", generation=2, driver="2.26.0.0"))
    await world.settle()
    [obj] = world.pool("n1")
    assert obj["spec"]["pool"]["generation"] == 2


async def test_moving_counters_write_nothing_and_are_not_kept(world: World) -> None:
    def counting(generation: int, success: int) -> NodeInventory:
        base = inventory("n1", generation=generation)
        devices = tuple(
            msgspec.structs.replace(
                d,
                ecc=EccCounters(mem_uncorrected=Counter(total=success, present=0)),
                cores=(
                    CoreStatus(index=0, counters={"success": Counter(total=success, present=1)}),
                ),
            )
            for d in base.hardware.devices
        )
        return msgspec.structs.replace(
            base, hardware=msgspec.structs.replace(base.hardware, devices=devices)
        )

    world.add_node("n1")
    world.controller.accept(counting(1, 10))
    await world.settle()
    world.controller.accept(counting(2, 11))  # a heartbeat: only the statistics moved
    await world.settle()
    assert world.store.writes == {"n1-neuron.aws.com-0": 1}
    held = world.controller.inventories["n1"]
    assert held.generation == 2
    assert all(not d.cores and d.ecc == EccCounters() for d in held.hardware.devices)


async def test_an_echo_is_told_from_a_change_without_building_the_pool(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[str] = []
    real = slices_module.build_pool

    def counting_build(**kwargs: Any) -> PoolContent:
        built.append(kwargs["node"])
        return real(**kwargs)

    monkeypatch.setattr(controller_module, "build_pool", counting_build)
    world.add_node("n1")
    world.controller.accept(inventory("n1"))
    await world.settle()
    for _ in range(3):  # Node and slice informer echoes
        world.controller.node_changed("MODIFIED", {"metadata": {"name": "n1"}})
        await world.settle()
    assert built == ["n1"]
    assert world.store.writes == {"n1-neuron.aws.com-0": 1}
    world.nodes["n1"] = NodeInfo(
        name="n1", uid="uid", labels={"topology.k8s.aws/network-node-layer-1": "nn-2"}
    )
    world.controller.node_changed("MODIFIED", {"metadata": {"name": "n1"}})
    await world.settle()
    assert built == ["n1", "n1"]
    assert world.store.writes == {"n1-neuron.aws.com-0": 2}
    # A slice changed behind the publisher's back is rebuilt and written again.
    del world.store.objects["n1-neuron.aws.com-0"]
    world.controller.stored["n1"].clear()
    world.controller.node_changed("MODIFIED", {"metadata": {"name": "n1"}})
    await world.settle()
    assert built == ["n1", "n1", "n1"]
    assert world.store.writes == {"n1-neuron.aws.com-0": 3}


async def test_an_older_inventory_is_ignored(world: World) -> None:
    world.add_node("n1")
    world.controller.accept(inventory("n1", generation=5, driver="2.26.0.0"))
    assert not world.controller.accept(inventory("n1", generation=4))
    await world.settle()
    [obj] = world.pool("n1")
    assert obj["spec"]["devices"][0]["attributes"]["neuronDriverVersion"] == {"string": "2.26.0.0"}


async def test_waits_for_the_node_then_writes(world: World) -> None:
    world.controller.accept(inventory("late"))
    await world.settle()
    assert world.pool("late") == []
    world.add_node("late")
    world.controller.node_changed("ADDED", {"metadata": {"name": "late"}})
    await world.settle()
    assert len(world.pool("late")) == 1


async def test_a_vanished_node_loses_its_pool(world: World) -> None:
    world.add_node("n1")
    world.controller.accept(inventory("n1"))
    await world.settle()
    del world.nodes["n1"]
    world.controller.node_changed("DELETED", {"metadata": {"name": "n1"}})
    await world.settle()
    assert world.pool("n1") == []


async def test_api_errors_are_retried_with_backoff(world: World) -> None:
    world.add_node("n1")
    world.store.fail_next = [ConnectionError("apiserver down"), TimeoutError()]
    world.controller.accept(inventory("n1"))
    await asyncio.sleep(0.2)
    await world.settle()
    assert len(world.pool("n1")) == 1


async def test_a_slice_deleted_by_someone_else_is_put_back(world: World) -> None:
    world.add_node("n1")
    world.controller.accept(inventory("n1"))
    await world.settle()
    [obj] = world.pool("n1")
    del world.store.objects[obj["metadata"]["name"]]
    world.controller.slice_changed("DELETED", obj)
    await world.settle()
    [again] = world.pool("n1")
    assert again["spec"]["pool"]["generation"] == 1


async def test_a_conflict_reads_the_pool_again_and_converges(world: World) -> None:
    world.add_node("n1")
    world.controller.accept(inventory("n1"))
    await world.settle()
    # Someone bumped the slice behind our back: our resourceVersion is stale.
    [obj] = world.pool("n1")
    name = obj["metadata"]["name"]
    world.store._stamp(world.store.objects[name])
    world.controller.accept(inventory("n1", generation=2, driver="2.26.0.0"))
    await asyncio.sleep(0.1)
    await world.settle()
    [obj] = world.pool("n1")
    assert obj["spec"]["devices"][0]["attributes"]["neuronDriverVersion"] == {"string": "2.26.0.0"}


def test_an_unusable_inventory_is_permanent() -> None:
    w = World()
    bad = msgspec.structs.replace(inventory("n1"), hardware=NodeHardware(instance_type="m5.large"))
    with pytest.raises(PermanentError, match=r"NodeInventory n1: hardware\.instance_type"):
        w.controller.accept(bad)


def test_lease_rules() -> None:
    now = datetime(2026, 1, 1, 0, 0, 30, tzinfo=UTC)
    fresh = LeaseState(holder="a", renewed=datetime(2026, 1, 1, 0, 0, 20, tzinfo=UTC), duration=15)
    stale = LeaseState(holder="a", renewed=datetime(2026, 1, 1, 0, 0, 10, tzinfo=UTC), duration=15)
    assert decide(None, me="b", now=now)
    assert decide(fresh, me="a", now=now), "the holder renews"
    assert not decide(fresh, me="b", now=now), "nobody takes a live lease"
    assert decide(stale, me="b", now=now), "an expired lease is taken over"


TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def test_the_write_that_tags_a_workload_joins_the_trace_on_the_node() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    store = MemorySliceStore()
    nodes: dict[str, NodeInfo] = {"n1": NodeInfo(name="n1", uid="u", labels={})}
    controller = Controller(
        store=store,
        nodes=nodes.get,
        mode=NodeDeviceMode.COUNTERS,
        dra_driver_version="0.1.0",
        tracer=provider.get_tracer("test"),
    )
    controller.inventories["n1"] = inventory("n1")
    await controller.reconcile("n1")
    assert exporter.get_finished_spans() == ()  # no workload: no span

    record = {
        "metadata": {"name": "n1", "uid": "u", "annotations": {TRACEPARENT_ANNOTATION: TRACEPARENT}}
    }
    assert NodeInfo.from_object(record).traceparent == ""  # no allocation record on it
    allocated = msgspec.json.decode(msgspec.json.encode(record))
    allocated["metadata"]["annotations"][NODE_ALLOCATION] = msgspec.json.encode(
        NodeAllocation(
            workload="default/train",
            workload_uid="w1",
            workload_id="train",
            phase="Bound",
            nodes=1,
            mode=4,
            server_id="0123456789abcdef",
            node_id=0,
            topo_id=0,
            topo0_host="n1",
        )
    ).decode()
    nodes["n1"] = NodeInfo.from_object(allocated)
    assert nodes["n1"].traceparent == TRACEPARENT
    await controller.reconcile("n1")
    [span] = exporter.get_finished_spans()
    assert span.name == "tag ResourceSlices"
    assert span.parent is not None
    assert format(span.parent.span_id, "016x") == "00f067aa0ba902b7"
    assert format(span.context.trace_id, "032x") == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert span.attributes is not None
    assert span.attributes["neuron.workload.id"] == "train"
    # Writes that keep the tag (an inventory change) are not part of the workload's story.
    controller.inventories["n1"] = inventory("n1", generation=2, driver="2.25.0.0")
    await controller.reconcile("n1")
    assert len(exporter.get_finished_spans()) == 1
