"""The scale benchmark's bus: three real NATS servers started from the eks overlay's
``nats.conf``, the product's streams in three copies on them, and the simulated fleet's
heartbeats stored there the way discovery's are (one per node, the newest kept), none from a
node once it is silenced."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from neuron_dra_common.bus import Bus
from neuron_dra_common.bus.declarations import HEARTBEAT
from neuron_dra_common.events import NodeHeartbeat, decode

from bench.fleetsim import Agents, FleetSim
from bench.natscluster import NatsCluster, nats_cluster


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[NatsCluster]:
    with nats_cluster(tmp_path) as running:
        yield running


async def test_the_overlay_config_makes_one_cluster_of_three_with_streams_in_three_copies(
    cluster: NatsCluster, tmp_path: Path
) -> None:
    conf = (tmp_path / "nats-1" / "nats.conf").read_text()
    assert "server_name: nats-1" in conf
    assert "max_file_store: 8GB" in conf
    assert "include ./cluster-tls.conf" in conf
    bus = await Bus.connect(cluster.urls, name="test-scale")
    try:
        await bus.reconcile(replicas=3)
        info = await bus.js.stream_info(HEARTBEAT.name)
        assert info.config.num_replicas == 3
        assert info.cluster is not None
        copies = {info.cluster.leader, *(r.name for r in info.cluster.replicas or [])}
        assert copies == {"nats-0", "nats-1", "nats-2"}
    finally:
        await bus.close()


async def test_the_fleet_beats_for_every_node_but_a_silenced_one(cluster: NatsCluster) -> None:
    bus = await Bus.connect(cluster.urls, name="test-scale")
    reader = await nats.connect(cluster.urls[2])
    try:
        await bus.reconcile(replicas=3)
        names = ["node-a", "node-b", "node-c"]
        fleet = FleetSim(
            kube=None,  # no kubelet part in this test
            publisher=bus.publisher(source="/test/scale"),
            nodes={n: {} for n in names},
        )
        await fleet.beat(names)
        acked = fleet.silence("node-b")
        assert acked == fleet.last_beat["node-b"]
        await fleet.beat(names)
        assert fleet.beats_sent == 5
        js = reader.jetstream()
        sequences = {}
        for name in names:
            stored = await js.get_last_msg(HEARTBEAT.name, f"neuron.heartbeat.{name}")
            assert stored.data is not None
            event = decode(stored.data)
            assert isinstance(event, NodeHeartbeat)
            assert event.node == name
            assert event.interval_seconds == 1.0
            sequences[name] = event.sequence
        assert sequences == {"node-a": 2, "node-b": 1, "node-c": 2}
        fleet.resume("node-b")
        await fleet.beat(["node-b"])
        stored = await js.get_last_msg(HEARTBEAT.name, "neuron.heartbeat.node-b")
        assert stored.data is not None
        again = decode(stored.data)
        assert isinstance(again, NodeHeartbeat)
        assert again.sequence == 3
    finally:
        await reader.close()
        await bus.close()


async def test_the_agents_process_beats_every_second_and_stops_a_silenced_node(
    cluster: NatsCluster,
) -> None:
    bus = await Bus.connect(cluster.urls, name="test-scale")
    await bus.reconcile(replicas=3)
    await bus.close()
    agents = await Agents.start(cluster.urls, ["node-a", "node-b"])
    reader = await nats.connect(cluster.urls[0])
    try:
        await asyncio.sleep(2.5)
        acked = await agents.silence("node-b")
        assert 0 < acked <= time.perf_counter()
        await asyncio.sleep(2.0)
        beats, failed = await agents.stats()
        assert failed == ""
        assert beats >= 6
        js = reader.jetstream()
        last = {}
        for name in ("node-a", "node-b"):
            stored = await js.get_last_msg(HEARTBEAT.name, f"neuron.heartbeat.{name}")
            assert stored.data is not None
            event = decode(stored.data)
            assert isinstance(event, NodeHeartbeat)
            last[name] = event.sequence
        # node-b's heartbeats stopped about two beats before node-a's.
        assert last["node-a"] - last["node-b"] >= 1
    finally:
        await reader.close()
        await agents.stop()
