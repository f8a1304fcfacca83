"""A three-server NATS cluster, as the eks overlay runs it (its ``nats.conf``): every stream
kept in three copies, never fewer, and the bus keeps working when one server goes."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from neuron_dra_common.bus import STREAMS, Bus
from neuron_dra_common.bus.declarations import HEARTBEAT
from neuron_dra_common.events import NodeHeartbeat

from tests.fixtures.nats import NatsCluster


@pytest.fixture
async def bus(nats_cluster: NatsCluster) -> AsyncIterator[Bus]:
    bus = await Bus.connect(nats_cluster.urls, name="test")
    try:
        yield bus
    finally:
        with contextlib.suppress(Exception):
            await bus.close()


async def _reconcile(bus: Bus, *, replicas: int) -> dict[str, str]:
    # A new cluster elects its JetStream leader after the servers answer /healthz.
    deadline = time.monotonic() + 30.0
    while True:
        try:
            return dict(await bus.reconcile(replicas=replicas))
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def test_streams_get_three_copies_and_a_smaller_setting_never_removes_them(
    bus: Bus,
) -> None:
    created = await _reconcile(bus, replicas=3)
    assert set(created.values()) == {"created"}
    for spec in STREAMS:
        info = await bus.js.stream_info(spec.name)
        assert info.config.num_replicas == 3, spec.name
        assert info.cluster is not None, spec.name
        assert len(info.cluster.replicas or ()) == 2, spec.name
    # A process left at the default (one copy) starting later takes nothing away.
    again = await _reconcile(bus, replicas=1)
    assert set(again.values()) == {"unchanged"}
    for spec in STREAMS:
        assert (await bus.js.stream_info(spec.name)).config.num_replicas == 3, spec.name


async def test_the_bus_keeps_its_streams_when_one_server_goes(
    bus: Bus, nats_cluster: NatsCluster
) -> None:
    await _reconcile(bus, replicas=3)
    publisher = bus.publisher(source="test")
    event = NodeHeartbeat(node="trn2-0", boot_id="b", sequence=1, sent_at=datetime.now(UTC))
    await publisher.publish(event)
    leader = (await bus.js.stream_info(HEARTBEAT.name)).cluster
    assert leader is not None
    down = leader.leader
    assert down is not None
    nats_cluster.servers[down].kill()
    # The other two elect a new leader and serve the same message; publishing goes on.
    deadline = time.monotonic() + 30
    while True:
        try:
            msg = await bus.js.get_last_msg(HEARTBEAT.name, event.subject)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
    assert msg.data
    later = NodeHeartbeat(node="trn2-0", boot_id="b", sequence=2, sent_at=datetime.now(UTC))
    await publisher.publish(later)
    info = await bus.js.stream_info(HEARTBEAT.name)
    assert info.cluster is not None
    assert info.cluster.leader != down
