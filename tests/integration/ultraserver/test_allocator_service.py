"""The topology allocator process over a real NATS server: requests, races, restarts."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from neuron_dra_common.bus import ALLOCATOR_SUBJECT, Bus, RpcError, request
from neuron_dra_common.bus.declarations import ALLOCATION
from neuron_dra_common.events import (
    AllocationDecided,
    AllocationReleased,
    AllocationRequested,
    DeviceHealthChanged,
    NodeInventory,
    ObjectRef,
)
from neuron_dra_common.hardware.model import NodeHardware, UltraServerInfo

from tests.fixtures.nats import NatsServer, free_port

TYPE = "trn2u.48xlarge"


def inventory(us: int, node: int) -> NodeInventory:
    return NodeInventory(
        node=f"us{us}-n{node}",
        boot_id="boot",
        generation=1,
        observed_at=datetime.now(UTC),
        hardware=NodeHardware(
            instance_type=TYPE,
            ultraserver=UltraServerInfo(
                server_id_4=f"{us + 1:016x}",  # all zeros means an election
                server_id_2=f"{us + 1:014x}p{node // 2}",
                node_id_4=node,
                node_id_2=node % 2,
                supported_modes=(1, 2, 3, 4),
            ),
        ),
    )


class AllocatorProcess:
    def __init__(self, nats: NatsServer, log: Path) -> None:
        self.nats, self.log = nats, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {
            **os.environ,
            **self.nats.open_env,
            "NEURON_DRA_HTTP_PORT": str(free_port()),
            "NEURON_DRA_HTTP_HOST": "127.0.0.1",
        }
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "neuron_dra_topology_allocator"],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def stop(self) -> int:
        proc, self.proc = self.proc, None
        if proc is None:
            return 0
        proc.terminate()
        try:
            return proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()


@pytest.fixture
def allocator(nats_server: NatsServer, tmp_path: Path) -> Iterator[AllocatorProcess]:
    process = AllocatorProcess(nats_server, tmp_path / "allocator.log")
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
async def bus(nats_server: NatsServer) -> AsyncIterator[Bus]:
    b = await Bus.connect([nats_server.url], name="test")
    await b.reconcile()
    try:
        yield b
    finally:
        await b.close()


def ask(name: str, uid: str, size: int, count: int = 1, gen: int = 1) -> AllocationRequested:
    return AllocationRequested(
        request_id=f"{uid}-{gen}",
        workload=ObjectRef(namespace="ml", name=name, uid=uid),
        topology_size=size,
        server_count=count,
        instance_type=TYPE,
        generation=gen,
    )


async def call(bus: Bus, event: AllocationRequested | AllocationReleased) -> object:
    deadline = time.monotonic() + 30
    while True:
        try:
            return await request(bus, ALLOCATOR_SUBJECT, event, wait=5)
        except RpcError as exc:
            # Starting: no responder yet, or still reading the fleet.
            if time.monotonic() > deadline:
                raise
            if "no responder" not in str(exc) and "still reading" not in str(exc):
                raise
            await asyncio.sleep(0.2)


async def fleet(bus: Bus, servers: int) -> None:
    publisher = bus.publisher(source="/test")
    await publisher.publish_many([inventory(u, n) for u in range(servers) for n in range(4)])


async def test_grants_whole_ultraservers_and_is_idempotent(
    bus: Bus, allocator: AllocatorProcess
) -> None:
    await fleet(bus, 3)
    allocator.start()
    first = await call(bus, ask("train", "u-train", 4, 2))
    assert isinstance(first, AllocationDecided)
    assert first.granted, first.reason
    assert len(first.nodes) == 8
    assert [g.index for g in first.grants] == [0, 1]
    again = await call(bus, ask("train", "u-train", 4, 2))
    assert isinstance(again, AllocationDecided)
    assert again.nodes == first.nodes
    small = await call(bus, ask("pair", "u-pair", 2))
    assert isinstance(small, AllocationDecided)
    assert small.granted, small.reason
    assert small.grants[0].node_ids == (0, 1)
    assert small.grants[0].mode == 3


async def test_too_large_is_refused_with_reasons_then_fits_after_release(
    bus: Bus, allocator: AllocatorProcess
) -> None:
    await fleet(bus, 2)
    allocator.start()
    held = await call(bus, ask("a", "u-a", 4))
    assert isinstance(held, AllocationDecided)
    assert held.granted
    refused = await call(bus, ask("b", "u-b", 4, 2))
    assert isinstance(refused, AllocationDecided)
    assert not refused.granted
    assert "taken by workload ml/a" in refused.reason
    assert {r.code for r in refused.refusals} == {"taken"}
    released = await call(
        bus,
        AllocationReleased(
            request_id="r1", workload=ObjectRef(namespace="ml", name="a", uid="u-a")
        ),
    )
    assert isinstance(released, AllocationReleased)
    assert released.nodes == held.nodes
    now = await call(bus, ask("b", "u-b", 4, 2))
    assert isinstance(now, AllocationDecided)
    assert now.granted


async def test_two_workloads_racing_for_the_last_ultraserver_one_wins(
    bus: Bus, allocator: AllocatorProcess
) -> None:
    await fleet(bus, 1)
    allocator.start()
    await call(bus, ask("warm", "u-warm", 1))
    await call(
        bus,
        AllocationReleased(
            request_id="w", workload=ObjectRef(namespace="ml", name="warm", uid="u-warm")
        ),
    )
    answers = await asyncio.gather(*(call(bus, ask(f"r{i}", f"u-r{i}", 4)) for i in range(6)))
    granted = [a for a in answers if isinstance(a, AllocationDecided) and a.granted]
    assert len(granted) == 1


async def test_unhealthy_node_is_not_allocated_and_named(
    bus: Bus, allocator: AllocatorProcess
) -> None:
    await fleet(bus, 1)
    await bus.publisher(source="/test").publish(
        DeviceHealthChanged(
            node="us0-n3",
            device="neurondevice5",
            health="Unhealthy",
            reason="HBM_UNCORRECTABLE_ERROR",
        )
    )
    allocator.start()
    refused = await call(bus, ask("a", "u-a", 4))
    assert isinstance(refused, AllocationDecided)
    assert not refused.granted
    assert refused.refusals[0].code == "too-few-healthy-nodes"
    assert "HBM_UNCORRECTABLE_ERROR" in refused.reason
    pair = await call(bus, ask("p", "u-p", 2))
    assert isinstance(pair, AllocationDecided)
    assert pair.nodes == ("us0-n0", "us0-n1")


async def test_restart_remembers_grants_and_releases(bus: Bus, allocator: AllocatorProcess) -> None:
    await fleet(bus, 3)
    allocator.start()
    a = await call(bus, ask("a", "u-a", 4))
    b = await call(bus, ask("b", "u-b", 4))
    await call(
        bus,
        AllocationReleased(
            request_id="ra", workload=ObjectRef(namespace="ml", name="a", uid="u-a")
        ),
    )
    assert isinstance(a, AllocationDecided)
    assert isinstance(b, AllocationDecided)
    assert allocator.stop() == 0
    allocator.start()
    again = await call(bus, ask("b", "u-b", 4))
    assert isinstance(again, AllocationDecided)
    assert again.nodes == b.nodes
    # us of a is free again, one more is free: two whole UltraServers, not three.
    c = await call(bus, ask("c", "u-c", 4, 2))
    assert isinstance(c, AllocationDecided)
    assert c.granted
    assert set(c.nodes) & set(b.nodes) == set()
    d = await call(bus, ask("d", "u-d", 1))
    assert isinstance(d, AllocationDecided)
    assert not d.granted


async def test_restart_after_the_allocation_stream_was_purged_serves_from_empty(
    bus: Bus, allocator: AllocatorProcess
) -> None:
    # Its history gone (purged, or every decision older than the stream's max age), the
    # allocator starts from no grants rather than waiting for a message that never comes;
    # the operator's ownership in Kubernetes is what keeps held UltraServers held.
    await fleet(bus, 1)
    allocator.start()
    first = await call(bus, ask("a", "u-a", 4))
    assert isinstance(first, AllocationDecided)
    assert first.granted, first.reason
    assert allocator.stop() == 0
    await bus.js.purge_stream(ALLOCATION.name)
    allocator.start()
    # The operator re-sends a held workload's nodes: adopted, not placed anew.
    held = await call(
        bus,
        AllocationRequested(
            request_id="u-a-again",
            workload=ObjectRef(namespace="ml", name="a", uid="u-a"),
            topology_size=4,
            server_count=1,
            instance_type=TYPE,
            generation=1,
            nodes=first.nodes,
        ),
    )
    assert isinstance(held, AllocationDecided)
    assert held.granted, held.reason
    assert held.nodes == first.nodes
    other = await call(bus, ask("b", "u-b", 4))
    assert isinstance(other, AllocationDecided)
    assert not other.granted
