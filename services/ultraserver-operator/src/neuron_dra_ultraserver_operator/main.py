"""``neuron-dra-ultraserver-operator``: informers, queues, leader election, run.

Every replica keeps its informers current (a standby takes over with warm caches); only the
one holding the Lease reconciles and writes. The leader's work stops as soon as it cannot
renew the Lease in time: the process exits and comes back as a candidate.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Sequence
from typing import Final

from neuron_dra_common.bus import Bus, Follower, credentials_of, inbox_prefix, limits_of, request
from neuron_dra_common.bus.declarations import HEALTH
from neuron_dra_common.events import AnyEvent, Event
from neuron_dra_common.events.base import SUBJECT_ROOT
from neuron_dra_common.kube import (
    NODES,
    RESOURCE_SLICES,
    Elector,
    Informer,
    WorkQueue,
    connect,
    run_workers,
)
from neuron_dra_common.runtime import Service, serve
from neuron_dra_common.ultraserver import NAMESPACE

from neuron_dra_ultraserver_operator import faults
from neuron_dra_ultraserver_operator.discovery import node_devices_only
from neuron_dra_ultraserver_operator.fleet import Fleet, FleetIndex
from neuron_dra_ultraserver_operator.health import NodeHealth
from neuron_dra_ultraserver_operator.pending import PendingPods
from neuron_dra_ultraserver_operator.reconciler import WorkloadReconciler
from neuron_dra_ultraserver_operator.resources import NUS, NUSW
from neuron_dra_ultraserver_operator.settings import OperatorSettings
from neuron_dra_ultraserver_operator.triggers import Triggers
from neuron_dra_ultraserver_operator.ultraservers import UltraServerReconciler, ensure_namespace

__all__ = ["build", "health_reader", "main"]

NAME: Final = "ultraserver-operator"


async def build(settings: OperatorSettings) -> Service:
    crash = faults.from_env()
    client = await connect(kubeconfig=settings.kubeconfig or None)
    bus = await Bus.connect(
        settings.nats_servers,
        name=NAME,
        limits=limits_of(settings),
        credentials=credentials_of(settings),
        inbox=inbox_prefix(NAME),
    )

    workloads_inf = Informer(client, NUSW)
    ultraservers_inf = Informer(client, NUS, namespace=NAMESPACE)
    nodes_inf = Informer(client, NODES)
    slices_inf = Informer(client, RESOURCE_SLICES, transform=node_devices_only)
    fleet = Fleet(nodes_inf.cache, slices_inf.cache)
    # One by-node index of the fleet, rebuilt once per fleet change, for triggers and reconciler.
    # Nodes lost or with a failed device, from the bus (the Node's Ready condition lags).
    health = NodeHealth(lambda node, failed: triggers.on_node_health(node, failed))
    index = FleetIndex(fleet, nodes_inf.cache, health)
    wq: WorkQueue[str] = WorkQueue(name="workloads", qps=50.0, burst=200)
    uq: WorkQueue[str] = WorkQueue(name="ultraservers", qps=50.0, burst=200)
    triggers = Triggers(
        workloads=workloads_inf.cache,
        fleet=fleet,
        index=index,
        workload_queue=wq,
        ultraserver_queue=uq,
    )

    async def allocate(event: Event) -> AnyEvent:
        return await request(
            bus, settings.allocator_subject, event, wait=settings.allocator_timeout
        )

    publisher = bus.publisher(source=f"/neuron-dra/{NAME}")

    async def publish(event: Event, msg_id: str) -> object:
        return await publisher.publish(event, msg_id=msg_id)

    workloads = WorkloadReconciler(
        client=client,
        workloads=workloads_inf.cache,
        nodes=nodes_inf.cache,
        fleet=index,
        allocate=allocate,
        changed=triggers.ultraservers_changed,
        requeue=wq.add_after,
        released=triggers.capacity_released,
        claim_wait_seconds=settings.claim_wait_seconds,
        crash=crash,
        publish=publish,
    )
    ultraservers = UltraServerReconciler(
        client=client,
        objects=ultraservers_inf.cache,
        workloads=workloads_inf.cache,
        fleet=fleet,
        failed=health,
    )
    workloads_inf.add_listener(triggers.on_workload)
    nodes_inf.add_listener(triggers.on_node)
    slices_inf.add_listener(triggers.on_slice)
    ultraservers_inf.add_listener(triggers.on_ultraserver)
    # Why pods wait: an Event on each, a condition on their workloads (pending.py).
    pending = PendingPods(
        client,
        nodes=nodes_inf.cache,
        workloads=workloads_inf.cache,
        ultraservers=ultraservers_inf.cache,
    )
    nodes_inf.add_listener(pending.on_change)
    workloads_inf.add_listener(pending.invalidate)
    ultraservers_inf.add_listener(pending.invalidate)
    informers = {
        "workloads-informer": workloads_inf,
        "ultraservers-informer": ultraservers_inf,
        "nodes-informer": nodes_inf,
        "slices-informer": slices_inf,
        **pending.informers,
    }

    # Every replica follows the health stream from its start (a standby takes over knowing
    # which nodes are lost); replayed, so a restart knows them again.
    health_follower = health_reader(bus, health)

    async def resync() -> None:
        """Every workload again each ``resync_seconds``: an event can be missed, and the
        allocator can restart without its history; neither may go unnoticed for long."""
        while True:
            await asyncio.sleep(settings.resync_seconds)
            for key in list(workloads_inf.cache):
                wq.add(key)

    async def lead() -> None:
        # Every key the informers reported while this replica waited is queued already.
        await ensure_namespace(client)
        await asyncio.gather(*(i.wait_synced() for i in informers.values()))
        await health_follower.wait_caught_up()
        # A later term (the Lease lost in an apiserver outage, then held again) looks at
        # everything once more: the last term's workers were cancelled mid-key.
        for key in list(workloads_inf.cache):
            wq.add(key)
        for obj in list(ultraservers_inf.cache.values()):
            uq.add(str(obj["metadata"]["name"]))
        resyncing = asyncio.create_task(resync(), name="workloads-resync")
        try:
            await asyncio.gather(
                run_workers(wq, workloads.reconcile, workers=settings.workload_workers),
                run_workers(uq, ultraservers.reconcile, workers=2),
                pending.run(),
            )
        finally:
            resyncing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await resyncing

    def drain() -> None:
        wq.shutdown()
        uq.shutdown()
        pending.shutdown()

    elector = Elector(
        client,
        namespace=settings.namespace,
        name=settings.lease_name,
        identity=settings.identity or socket.gethostname(),
        lease_seconds=settings.lease_seconds,
    )

    service = Service(name=NAME, settings=settings)
    for name, informer in informers.items():
        service.add_task(name, informer.run, stop=informer.stop, ready=_synced(informer))
    service.add_task("health", health_follower.run, stop=health_follower.stop)
    # A standby is ready too: it is healthy and takes over the moment the leader goes.
    service.add_task("leader", lambda: elector.serve(lead, drain=drain), stop=elector.stop)
    service.add_readiness("nats", lambda: bus.connected)
    service.on_shutdown(bus.close)
    service.on_shutdown(client.close)
    return service


def health_reader(bus: Bus, health: NodeHealth) -> Follower:
    """The reader of node and device health; refused events go to its dead letter."""
    return Follower(
        bus,
        name=f"{NAME}-health",
        stream=HEALTH.name,
        subject=f"{SUBJECT_ROOT}.health.>",
        handler=health.apply,
    )


def _synced(informer: Informer) -> Callable[[], bool]:
    return lambda: informer.synced


def main(argv: Sequence[str] | None = None) -> int:
    return serve(
        OperatorSettings, build, name=NAME, prog="neuron-dra-ultraserver-operator", argv=argv
    )
