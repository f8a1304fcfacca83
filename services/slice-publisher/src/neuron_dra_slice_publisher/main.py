"""``neuron-dra-slice-publisher``: settings, wiring, run."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Sequence

from neuron_dra_common.bus import (
    Bus,
    PermanentError,
    credentials_of,
    inbox_prefix,
    limits_of,
)
from neuron_dra_common.bus.declarations import INVENTORY, share_consumers
from neuron_dra_common.driver import package_version
from neuron_dra_common.events import DeviceTaintChanged
from neuron_dra_common.kube import (
    NODES,
    RESOURCE_SLICES,
    Informer,
    connect,
    run_workers,
)
from neuron_dra_common.runtime import Service, serve

from neuron_dra_slice_publisher.announce import TaintAnnouncer
from neuron_dra_slice_publisher.controller import Controller, NodeInfo
from neuron_dra_slice_publisher.partitions import Shares
from neuron_dra_slice_publisher.pool import slice_summary
from neuron_dra_slice_publisher.settings import SlicePublisherSettings
from neuron_dra_slice_publisher.store import SELECTOR, KubeSliceStore
from neuron_dra_slice_publisher.wiring import (
    detect_mode,
    detect_taints,
    read_announced,
    read_health,
    read_inventories,
)

__all__ = ["build", "main"]

NAME = "slice-publisher"


async def build(settings: SlicePublisherSettings) -> Service:
    """Connect to the API and the bus; lead (consume and write) a share of the nodes only
    while holding its Lease."""
    kube = await connect(kubeconfig=settings.kubeconfig or None)
    try:
        bus = await Bus.connect(
            settings.nats_servers,
            name=NAME,
            limits=limits_of(settings),
            credentials=credentials_of(settings),
            inbox=inbox_prefix(NAME),
        )
    except BaseException:
        await kube.close()
        raise
    try:
        shares = share_consumers(settings.partitions)
        await bus.reconcile(
            consumers=[spec for pair in shares for spec in pair],
            replicas=settings.stream_replicas,
        )
        # Decided once per process, from the apiserver's answer only (never from an error):
        # every replica and every restart of one cluster agrees.
        mode = await detect_mode(kube, settings.node_device, patience=settings.probe_timeout)
        taints_served = await detect_taints(
            kube, settings.device_taints, patience=settings.probe_timeout
        )
    except BaseException:
        # A start that fails here closes its connections: no session is left to the
        # collector (which would log it as unclosed after the one-line start error).
        await bus.close()
        await kube.close()
        raise
    publisher = bus.publisher(source=f"/neuron-dra/{NAME}")

    async def publish(event: DeviceTaintChanged, msg_id: str) -> None:
        await publisher.publish(event, msg_id=msg_id)

    electors = Shares(
        kube,
        namespace=settings.namespace,
        lease_name=settings.lease_name,
        partitions=settings.partitions,
        identity=settings.identity or socket.gethostname(),
        lease_seconds=settings.lease_seconds,
    )
    partitioned = settings.partitions > 1

    async def lead(share: int) -> None:
        # Everything a term of leadership knows is made here, afresh: after a lost Lease
        # (an apiserver outage) the next term must not trust what the last one saw.
        # A Node's labels, UID and the operator's record are all metadata: its status
        # (images, conditions, heartbeats) is never sent to the publisher.
        nodes = Informer(kube, NODES, metadata_only=True)

        def lookup(name: str) -> NodeInfo | None:
            obj = nodes.cache.get(name)
            return NodeInfo.from_object(obj) if obj is not None else None

        controller = Controller(
            store=KubeSliceStore(kube, encoding=settings.slice_encoding),
            nodes=lookup,
            mode=mode,
            dra_driver_version=package_version(),
            taints_served=taints_served,
            announcer=TaintAnnouncer(publish, withheld=not taints_served),
            partitioned=partitioned,
        )
        inventory_spec, health_spec = shares[share]
        runner = bus.runner(inventory_spec, controller.handle)
        # Undecodable health events go to the dead letter like any other consumer's.
        health_runner = bus.runner(health_spec, controller.handle_health)
        slices = Informer(
            kube,
            RESOURCE_SLICES,
            label_selector=SELECTOR,
            transform=slice_summary,
            metadata_only=True,
        )
        nodes.add_listener(controller.node_changed)
        slices.add_listener(controller.slice_changed)
        informers = [
            asyncio.create_task(nodes.run(), name="nodes-informer"),
            asyncio.create_task(slices.run(), name="slices-informer"),
        ]
        try:
            await nodes.wait_synced()
            await slices.wait_synced()
            await controller.load_stored()
            stored = await read_inventories(
                bus,
                name=inventory_spec.durable,
                subjects=inventory_spec.filter_subjects or INVENTORY.subjects,
            )
            for inventory in stored:
                with contextlib.suppress(PermanentError):
                    controller.accept(inventory)
            for event in await read_announced(bus):
                controller.announcer.seed(event)
            for event in await read_health(bus):
                controller.accept_health(event)
            await asyncio.gather(
                runner.run(),
                health_runner.run(),
                run_workers(controller.queue, controller.reconcile, workers=settings.workers),
            )
        finally:
            runner.stop()
            health_runner.stop()
            controller.queue.shutdown()
            for informer in (nodes, slices):
                informer.stop()
            for task in informers:
                task.cancel()
            await asyncio.gather(*informers, return_exceptions=True)

    service = Service(name=NAME, settings=settings)
    # Every replica is ready (a standby is healthy); the leader's work shows in its metrics.
    service.add_task("leader", lambda: electors.serve(lead), stop=electors.stop)
    service.add_readiness("nats", lambda: bus.connected)
    service.on_shutdown(kube.close)
    service.on_shutdown(bus.close)
    return service


def main(argv: Sequence[str] | None = None) -> int:
    return serve(
        SlicePublisherSettings, build, name=NAME, prog="neuron-dra-slice-publisher", argv=argv
    )
