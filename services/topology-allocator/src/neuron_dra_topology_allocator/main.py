"""``neuron-dra-topology-allocator``: wiring and run."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from neuron_dra_common.bus import Bus, Follower, Responder, credentials_of, inbox_prefix, limits_of
from neuron_dra_common.bus.declarations import ALLOCATION, HEALTH, INVENTORY
from neuron_dra_common.events import AllocationReleased, AllocationRequested
from neuron_dra_common.events.base import SUBJECT_ROOT
from neuron_dra_common.runtime import Service, serve

from neuron_dra_topology_allocator.allocator import Allocator
from neuron_dra_topology_allocator.projection import Projection
from neuron_dra_topology_allocator.settings import AllocatorSettings

__all__ = ["allocation_responder", "build", "main", "projection_followers"]

NAME = "topology-allocator"


def projection_followers(bus: Bus, projection: Projection) -> dict[str, Follower]:
    """The readers that rebuild the fleet view: inventories, health, allocations."""
    return {
        kind: Follower(
            bus,
            name=f"{NAME}-{kind}",
            stream=stream.name,
            subject=f"{SUBJECT_ROOT}.{token}.>",
            handler=projection.apply,
        )
        for kind, stream, token in (
            ("inventory", INVENTORY, "inventory"),
            ("health", HEALTH, "health"),
            ("allocations", ALLOCATION, "allocation"),
        )
    }


def allocation_responder(bus: Bus, allocator: Allocator, *, subject: str) -> Responder:
    """The request/reply endpoint; what it refuses goes to ``topology-allocator-rpc``'s dead
    letter."""
    return Responder(
        bus,
        subject,
        allocator.handle,
        name=f"{NAME}-rpc",
        accepts=(AllocationRequested, AllocationReleased),
        queue=NAME,
    )


async def build(settings: AllocatorSettings) -> Service:
    """Connect, replay the fleet, then answer requests once the view is complete."""
    bus = await Bus.connect(
        settings.nats_servers,
        name=NAME,
        limits=limits_of(settings),
        credentials=credentials_of(settings),
        inbox=inbox_prefix(NAME),
    )
    await bus.reconcile(replicas=settings.stream_replicas)
    projection = Projection()
    allocator = Allocator(
        projection, sink=bus.publisher(source=f"/neuron-dra/{NAME}"), strategy=settings.strategy
    )
    followers = projection_followers(bus, projection)
    responder = allocation_responder(bus, allocator, subject=settings.subject)
    stopped = asyncio.Event()

    async def serve() -> None:
        # A stream with nothing left in it (purged, or every decision older than its max
        # age) counts as caught up, so the allocator serves from no grants instead of
        # waiting for a message that never comes. That hands out no UltraServer twice: who
        # holds what is kept in Kubernetes (each node's workload record and the workloads'
        # status), not here. The operator sends a holder's nodes with its request, so they
        # are adopted again, resyncs every workload periodically, and gives back any grant
        # of nodes another workload owns (rechecking that owner, which re-adopts them).
        await asyncio.gather(*(f.wait_caught_up() for f in followers.values()))
        projection.serving = True
        await responder.start()
        await stopped.wait()
        await responder.stop()

    service = Service(name=NAME, settings=settings)
    for name, follower in followers.items():
        service.add_task(name, follower.run, stop=follower.stop)
    service.add_task("requests", serve, stop=stopped.set, ready=lambda: responder.ready)
    service.add_readiness("nats", lambda: bus.connected)
    service.on_shutdown(bus.close)
    return service


def main(argv: Sequence[str] | None = None) -> int:
    return serve(
        AllocatorSettings, build, name=NAME, prog="neuron-dra-topology-allocator", argv=argv
    )
