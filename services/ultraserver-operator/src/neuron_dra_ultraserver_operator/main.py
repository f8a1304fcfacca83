"""``neuron-dra-ultraserver-operator``: settings, informers, queues, leader election, run.

Every replica keeps its informers current (a standby takes over with warm caches); only the
one holding the Lease reconciles and writes. The leader's work stops as soon as it cannot
renew the Lease in time: the process exits and comes back as a candidate.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Annotated, Any

import msgspec
from neuron_dra_common.bus import ALLOCATOR_SUBJECT, Bus, request
from neuron_dra_common.events import AnyEvent, Event
from neuron_dra_common.kube import (
    NODES,
    RESOURCE_SLICES,
    Elector,
    Informer,
    WorkQueue,
    connect,
    object_key,
    run_workers,
)
from neuron_dra_common.runtime import Service, serve
from neuron_dra_common.settings import LeaderElectedSettings
from neuron_dra_common.ultraserver import NAMESPACE

from neuron_dra_ultraserver_operator import faults
from neuron_dra_ultraserver_operator.discovery import (
    Identity,
    UltraServerView,
    discover,
    node_devices_only,
    slice_identities,
)
from neuron_dra_ultraserver_operator.model import NUS, NUSW
from neuron_dra_ultraserver_operator.ultraservers import UltraServerReconciler, ensure_namespace
from neuron_dra_ultraserver_operator.workloads import WorkloadReconciler

__all__ = ["OperatorSettings", "build", "main"]

NAME = "ultraserver-operator"
#: Workloads reconciled at once (each key by one worker at a time; the allocator decides
#: races for the same nodes).
WORKLOAD_WORKERS = 4
#: How long a burst of Node and slice changes may grow before the views are recomputed.
FLEET_SETTLE_SECONDS = 0.05
Obj = dict[str, Any]


class OperatorSettings(LeaderElectedSettings, frozen=True, kw_only=True):
    """The UltraServer operator."""

    lease_name: Annotated[str, msgspec.Meta(min_length=1, description="Lease name")] = (
        "neuron-dra-ultraserver-operator"
    )
    allocator_subject: Annotated[str, msgspec.Meta(description="Allocator subject")] = (
        ALLOCATOR_SUBJECT
    )
    allocator_timeout: Annotated[
        float, msgspec.Meta(gt=0, description="Seconds to wait for an allocator answer")
    ] = 10.0
    claim_wait_seconds: Annotated[
        float, msgspec.Meta(gt=0, description="Longest wait for claims to go on delete")
    ] = 300.0


class Fleet:
    """Discovery over the node and slice caches, recomputed only after a change it reads.

    Only what :func:`discover` looks at counts as a change: a Node's labels and Ready
    condition, a slice's node and the identity of its ``neuron_node`` device. The writes an
    allocation makes (node records, ``workloadId`` on the devices) leave the views alone.
    Each slice's identity is read once, when it changes, not at every recompute: with a
    thousand slices of 17 devices each, rescanning them was most of a recompute's cost.
    """

    def __init__(self, nodes: Mapping[str, Obj], slices: Mapping[str, Obj]) -> None:
        self._nodes, self._slices = nodes, slices
        self._views: dict[str, UltraServerView] | None = None
        #: key -> what discovery reads of the object; for a slice, (node, its identities)
        self._prints: dict[str, Any] = {}

    def __call__(self) -> dict[str, UltraServerView]:
        if self._views is None:
            identities: dict[str, Identity] = {}
            for key, obj in self._slices.items():
                held = self._prints.get(key)
                # A slice listed before its event reached this Fleet is read here.
                identities.update(held[1] if held is not None else slice_identities([obj]))
            self._views = discover(self._nodes.values(), identities=identities)
        return self._views

    @property
    def stale(self) -> bool:
        """A change was seen and the views are not recomputed yet."""
        return self._views is None

    @staticmethod
    def _fingerprint(obj: Obj) -> Any:
        spec = obj.get("spec") or {}
        if "driver" in spec:  # a ResourceSlice
            return (spec.get("nodeName"), slice_identities([obj]))
        conditions = (obj.get("status") or {}).get("conditions") or ()
        ready = [c.get("status") for c in conditions if c.get("type") == "Ready"]
        return ((obj.get("metadata") or {}).get("labels"), ready)

    def changed(self, key: str, obj: Obj | None) -> bool:
        """Forget the views if ``obj`` (``None``: deleted) changed what discovery reads."""
        if obj is None:
            if self._prints.pop(key, None) is None:
                return False
        else:
            fingerprint = self._fingerprint(obj)
            if self._prints.get(key) == fingerprint:
                return False
            self._prints[key] = fingerprint
        self._views = None
        return True


async def build(settings: OperatorSettings) -> Service:
    crash = faults.from_env()
    client = await connect(kubeconfig=settings.kubeconfig or None)
    bus = await Bus.connect(settings.nats_servers, name=NAME)

    workloads_inf = Informer(client, NUSW)
    ultraservers_inf = Informer(client, NUS, namespace=NAMESPACE)
    nodes_inf = Informer(client, NODES)
    slices_inf = Informer(client, RESOURCE_SLICES, transform=node_devices_only)
    workloads_cache, nodes_cache = workloads_inf.cache, nodes_inf.cache
    fleet = Fleet(nodes_cache, slices_inf.cache)
    wq: WorkQueue[str] = WorkQueue(name="workloads", qps=50.0, burst=200)
    uq: WorkQueue[str] = WorkQueue(name="ultraservers", qps=50.0, burst=200)

    async def allocate(event: Event) -> AnyEvent:
        return await request(
            bus, settings.allocator_subject, event, wait=settings.allocator_timeout
        )

    def changed(names: Iterable[str]) -> None:
        for name in names:
            uq.add(name)

    def waiting() -> None:
        # Capacity came back: every workload that waits gets another look, oldest first.
        items = sorted(
            workloads_inf.cache.values(),
            key=lambda o: str((o.get("metadata") or {}).get("creationTimestamp") or ""),
        )
        for obj in items:
            if ((obj.get("status") or {}).get("state") or "") in ("", "Pending"):
                wq.add(object_key(obj))

    workloads = WorkloadReconciler(
        client=client,
        workloads=workloads_cache,
        nodes=nodes_cache,
        fleet=fleet,
        allocate=allocate,
        changed=changed,
        requeue=wq.add_after,
        released=waiting,
        claim_wait_seconds=settings.claim_wait_seconds,
        crash=crash,
    )
    ultraservers = UltraServerReconciler(
        client=client,
        objects=ultraservers_inf.cache,
        workloads=workloads_cache,
        fleet=fleet,
    )

    def on_workload(kind: str, obj: Obj) -> None:
        wq.add(object_key(obj))
        for alloc in (obj.get("status") or {}).get("allocations") or ():
            uq.add(str(alloc.get("ultraServer")))

    def holding(node: str) -> None:
        """Queue the workloads whose allocations name ``node``."""
        for wl in workloads_inf.cache.values():
            allocs = (wl.get("status") or {}).get("allocations") or ()
            if any(n.get("nodeName") == node for a in allocs for n in a.get("nodes") or ()):
                wq.add(object_key(wl))

    # A burst of Node and slice events (a node group scaling, the publisher writing every
    # pool) is taken in one pass a moment later: one recompute of the views, each
    # UltraServer and each affected workload queued once, instead of a pass per event.
    touched: set[str] = set()
    nodes_touched = False
    flush: asyncio.TimerHandle | None = None

    def fleet_changed() -> None:
        nonlocal flush, nodes_touched
        flush = None
        names, touched_nodes, wake = fleet(), sorted(touched), nodes_touched
        touched.clear()
        nodes_touched = False
        for name in names:
            uq.add(name)
        for node in touched_nodes:
            holding(node)
        if wake:
            waiting()

    def on_fleet(kind: str, obj: Obj) -> bool:
        """A Node or slice event: True when it changed what discovery reads."""
        nonlocal flush
        if not fleet.changed(object_key(obj), None if kind == "DELETED" else obj):
            return False
        node = (obj.get("spec") or {}).get("nodeName") or (obj.get("metadata") or {}).get("name")
        touched.add(str(node))
        if flush is None:
            flush = asyncio.get_running_loop().call_later(FLEET_SETTLE_SECONDS, fleet_changed)
        return True

    def on_node(kind: str, obj: Obj) -> None:
        nonlocal nodes_touched
        if on_fleet(kind, obj):
            nodes_touched = True
            return
        # Only the node record (or nothing discovery reads) changed: the workloads that
        # hold the node look again, and so does its NeuronUltraServer's status.
        name = str((obj.get("metadata") or {}).get("name"))
        holding(name)
        if fleet.stale:
            return  # the pending pass queues every UltraServer
        for view in fleet().values():
            if any(m.node_name == name for m in view.members):
                uq.add(view.name)

    def on_slice(kind: str, obj: Obj) -> None:
        on_fleet(kind, obj)

    def on_ultraserver(kind: str, obj: Obj) -> None:
        uq.add(str((obj.get("metadata") or {}).get("name")))

    workloads_inf.add_listener(on_workload)
    nodes_inf.add_listener(on_node)
    slices_inf.add_listener(on_slice)
    ultraservers_inf.add_listener(on_ultraserver)
    informers = {
        "workloads-informer": workloads_inf,
        "ultraservers-informer": ultraservers_inf,
        "nodes-informer": nodes_inf,
        "slices-informer": slices_inf,
    }

    async def synced() -> None:
        await asyncio.gather(*(i.wait_synced() for i in informers.values()))

    async def lead() -> None:
        # Every key the informers reported while this replica waited is queued already.
        await ensure_namespace(client)
        await synced()
        await asyncio.gather(
            run_workers(wq, workloads.reconcile, workers=WORKLOAD_WORKERS),
            run_workers(uq, ultraservers.reconcile, workers=2),
        )

    def drain() -> None:
        wq.shutdown()
        uq.shutdown()

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
    # A standby is ready too: it is healthy and takes over the moment the leader goes.
    service.add_task("leader", lambda: elector.run(lead, drain=drain), stop=elector.stop)
    service.add_readiness("nats", lambda: bus.connected)
    service.on_shutdown(bus.close)
    service.on_shutdown(client.close)
    return service


def _synced(informer: Informer) -> Callable[[], bool]:
    return lambda: informer.synced


def main(argv: Sequence[str] | None = None) -> int:
    return serve(
        OperatorSettings, build, name=NAME, prog="neuron-dra-ultraserver-operator", argv=argv
    )
