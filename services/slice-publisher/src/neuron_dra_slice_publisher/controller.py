"""The publisher's state and its level-triggered reconcile of one node's pool.

Three things make a node's pool what it should be: the node's latest inventory (from the bus),
the Node object (labels, uid; from a Node informer) and the slices already stored. Each of
them changing only queues the node's name; a worker then builds the pool, plans the writes
against what this publisher last stored, and performs them. A failed call leaves the node
queued again with backoff (the work queue's), and a conflict re-reads the node's slices first.

Only one publisher writes at a time (see :mod:`neuron_dra_slice_publisher.leader`), so what
it wrote itself is the truth about the stored pool; slice events from the API matter only
when someone else changed or removed a slice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Final

import msgspec
from neuron_dra_common.bus import Delivery, PermanentError
from neuron_dra_common.driver import NODE_DEVICE, device_name
from neuron_dra_common.events import AnyEvent, DeviceHealthChanged, NodeInventory
from neuron_dra_common.hardware.model import EccCounters
from neuron_dra_common.kube import WorkQueue
from neuron_dra_common.telemetry import (
    TRACEPARENT_ANNOTATION,
    Counter,
    context_from_traceparent,
    get_tracer,
)
from neuron_dra_common.topology import UnknownInstanceType, instance_spec
from neuron_dra_common.ultraserver import NodeAllocationError, node_allocation
from opentelemetry import trace

from neuron_dra_slice_publisher.announce import TaintAnnouncer
from neuron_dra_slice_publisher.pool import (
    NODE_LABEL,
    NodeRef,
    Plan,
    StoredSlice,
    plan_pool,
    pool_is_current,
    stored_slice,
)
from neuron_dra_slice_publisher.slices import (
    InventoryError,
    NodeDeviceMode,
    PoolContent,
    build_pool,
    content_hash,
)
from neuron_dra_slice_publisher.store import Conflict, SliceStore
from neuron_dra_slice_publisher.taints import DeviceTaint, HealthTaints, taint_json

__all__ = ["Controller", "NodeInfo"]

log = logging.getLogger(__name__)

Obj = dict[str, Any]

POOL_WRITES = Counter(
    "neuron_dra_slice_publisher_pool_writes",
    "Pool reconciles, by outcome (written, deleted, unchanged)",
    ["outcome"],
)

_TRACER = get_tracer("neuron_dra_slice_publisher")


class NodeInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What the publisher needs of a Node object."""

    name: str
    uid: str
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    workload_id: str = ""
    #: The W3C traceparent the UltraServer operator wrote with the allocation record: the
    #: write that tags the node's devices with ``workload_id`` joins that workload's trace.
    traceparent: str = ""

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> NodeInfo:
        meta = obj.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        try:
            record = node_allocation(meta["name"], annotations)
        except NodeAllocationError as exc:
            log.error("UltraServer allocation record unreadable", extra={"error": str(exc)})
            record = None
        return cls(
            name=meta["name"],
            uid=meta.get("uid", ""),
            labels=dict(meta.get("labels") or {}),
            workload_id=record.workload_id if record is not None else "",
            traceparent=annotations.get(TRACEPARENT_ANNOTATION, "") if record is not None else "",
        )


NodeLookup = Callable[[str], NodeInfo | None]

#: What a pool is built from: the inventory, the Node's labels, its workload id and the
#: devices' taints.
_Taints = tuple[tuple[str, tuple[DeviceTaint, ...]], ...]
_Inputs = tuple[NodeInventory, tuple[tuple[str, str], ...], str, _Taints]

#: The failure detector's events, by tag: whether the node is lost.
_NODE_VERDICTS: Final = {"node.lost.v1": True, "node.recovered.v1": False}

TAINTS_SET = Counter(
    "neuron_dra_slice_publisher_health_events",
    "Device health events applied, by whether they changed a pool's taints",
    ["changed"],
)


class Controller:
    """Inventories in, pools out; :meth:`handle` is the bus handler, :meth:`reconcile` the
    work queue's."""

    def __init__(
        self,
        *,
        store: SliceStore,
        nodes: NodeLookup,
        mode: NodeDeviceMode,
        dra_driver_version: str,
        tracer: trace.Tracer | None = None,
        taints_served: bool = True,
        announcer: TaintAnnouncer | None = None,
        partitioned: bool = False,
    ) -> None:
        self.store = store
        #: Writing a share of the nodes only: those whose inventory came from its consumer.
        self.partitioned = partitioned
        self.health = HealthTaints()
        #: False where the cluster drops device taints (Kubernetes 1.34): tainted devices
        #: are then left out of the pool.
        self.taints_served = taints_served
        #: Reports each change of a device's taints on the bus once the pool carries it.
        self.announcer = announcer or TaintAnnouncer(withheld=not taints_served)
        self._tracer = tracer or _TRACER
        self.nodes = nodes
        self.mode = mode
        self.dra_driver_version = dra_driver_version
        self.queue: WorkQueue[str] = WorkQueue(name="pools", qps=50.0, burst=500)
        self.inventories: dict[str, NodeInventory] = {}
        self.stored: dict[str, dict[str, StoredSlice]] = {}
        self.generations: dict[str, int] = {}
        self.on_written: Callable[[str, int], None] | None = None
        # Per node, the inputs its pool was last built from and the digests of its slices:
        # enough to tell an informer echo from a change without keeping the pool's devices
        # (thousands of dicts per hundred nodes, which every full garbage collection scans).
        self._built: dict[str, tuple[_Inputs, tuple[str, ...]]] = {}

    # -- inputs --------------------------------------------------------------------------------

    def _content(
        self,
        inventory: NodeInventory,
        labels: Mapping[str, str],
        workload_id: str = "",
        taints: _Taints = (),
    ) -> PoolContent:
        return build_pool(
            node=inventory.node,
            hardware=inventory.hardware,
            labels=labels,
            mode=self.mode,
            dra_driver_version=inventory.dra_driver_version or self.dra_driver_version,
            workload_id=workload_id,
            taints={name: [taint_json(t) for t in ts] for name, ts in taints},
            hide_tainted=not self.taints_served,
        )

    def _taints(self, inventory: NodeInventory) -> _Taints:
        names = [device_name(d.index) for d in inventory.hardware.devices] + [NODE_DEVICE]
        return tuple(sorted(self.health.for_node(inventory.node, names).items()))

    @staticmethod
    def _check(inventory: NodeInventory) -> None:
        try:
            instance_spec(inventory.hardware.instance_type)
        except UnknownInstanceType as exc:
            raise InventoryError(
                f"NodeInventory {inventory.node}: hardware.instance_type: {exc}"
            ) from None

    def accept(self, inventory: NodeInventory) -> bool:
        """Keep ``inventory`` if it is not older than the one held; True when kept."""
        held = self.inventories.get(inventory.node)
        if held is not None and inventory.generation < held.generation:
            return False
        try:
            self._check(inventory)
        except InventoryError as exc:
            # No retry can make this inventory usable: straight to the dead letter.
            raise PermanentError(str(exc)) from exc
        self.inventories[inventory.node] = _without_statistics(inventory)
        self.queue.add(inventory.node)
        return True

    async def handle(self, event: AnyEvent, delivery: Delivery) -> None:
        """The bus handler of ``slice-publisher-inventory``: remember, queue, ack."""
        if isinstance(event, NodeInventory):
            self.accept(event)

    def accept_health(self, event: AnyEvent) -> bool:
        """Take a health event into account; True when a node's taints changed."""
        changed = False
        node = ""
        if isinstance(event, DeviceHealthChanged):
            node = event.node
            changed = self.health.apply(event)
        elif event.event_type() in _NODE_VERDICTS:
            # The cluster failure detector's verdicts (subject neuron.health.<node>.node),
            # known here by their tags: a node lost taints all its devices NoExecute.
            node = str(getattr(event, "node", ""))
            lost = _NODE_VERDICTS[event.event_type()]
            reason = str(getattr(event, "reason", ""))
            changed = bool(node) and self.health.set_lost(node, lost, reason=reason)
        else:
            return False
        TAINTS_SET.labels("yes" if changed else "no").inc()
        if changed:
            self.queue.add(node)
        return changed

    async def handle_health(self, event: AnyEvent, delivery: Delivery) -> None:
        """The bus handler of ``slice-publisher-health``: taints in, pool queued, ack."""
        self.accept_health(event)

    def node_changed(self, kind: str, obj: Obj) -> None:
        """Node informer listener: a new, relabelled or deleted Node needs its pool looked at."""
        name = (obj.get("metadata") or {}).get("name")
        if name:
            self.queue.add(name)

    def slice_changed(self, kind: str, obj: Obj) -> None:
        """Slice informer listener: act only on changes this publisher did not make."""
        seen = stored_slice(obj)
        node = ((obj.get("metadata") or {}).get("labels") or {}).get(NODE_LABEL, "")
        mine = self.stored.get(seen.pool or node, {})
        held = mine.get(seen.name)
        if kind == "DELETED":
            if held is not None and _not_older(held.resource_version, seen.resource_version):
                del mine[seen.name]
                self.queue.add(seen.pool)
            return
        if held is None or _newer(seen.resource_version, held.resource_version):
            self.stored.setdefault(seen.pool, {})[seen.name] = seen
            self.queue.add(seen.pool)

    def forget_node(self, node: str) -> None:
        self.stored.pop(node, None)

    # -- the reconcile -------------------------------------------------------------------------

    async def load_stored(self) -> None:
        """Read every slice this publisher manages (at start, and after a lost leadership)."""
        self.stored = {}
        for obj in await self.store.list_all():
            s = stored_slice(obj)
            self.stored.setdefault(s.pool, {})[s.name] = s
            self.queue.add(s.pool)

    async def _refresh(self, node: str) -> None:
        self.stored[node] = {s.name: s for s in map(stored_slice, await self.store.list_node(node))}

    async def reconcile(self, node: str) -> None:
        """Make the stored pool of ``node`` match its inventory and Node (or go with it)."""
        try:
            await self._reconcile(node)
        except Conflict as exc:
            log.info(
                "pool changed under us, reading it again", extra={"node": node, "error": str(exc)}
            )
            await self._refresh(node)
            raise

    async def _reconcile(self, node: str) -> None:
        if self.partitioned and node not in self.inventories:
            return  # another share's node (its Node, slices and health are seen by all)
        info = self.nodes(node)
        stored = list(self.stored.get(node, {}).values())
        inventory = self.inventories.get(node)
        digests: tuple[str, ...] | None = None
        tagging = False  # this write adds a workload's tag to the node's devices
        if info is None:
            self._built.pop(node, None)
            if not stored:
                return
            # The Node is gone: its pool goes too (garbage collection would, later).
            content = None
            owner = NodeRef(name=node, uid="")
        elif inventory is None:
            return
        else:
            owner = NodeRef(name=node, uid=info.uid)
            # Informer echoes re-run reconcile often; the pool only changes with its inputs.
            taints = self._taints(inventory)
            inputs: _Inputs = (
                inventory,
                tuple(sorted(info.labels.items())),
                info.workload_id,
                taints,
            )
            built = self._built.get(node)
            tagging = bool(info.workload_id) and (built is None or built[0][2] != info.workload_id)
            if (
                built is not None
                and built[0] == inputs
                and pool_is_current(built[1], owner=owner, stored=stored)
            ):
                POOL_WRITES.labels("unchanged").inc()
                await self._announce(node, taints, _generation(stored))
                return
            try:
                content = self._content(inventory, info.labels, info.workload_id, taints)
            except InventoryError as exc:
                log.error("pool not buildable", extra={"node": node, "error": str(exc)})
                return
            for reason in content.skipped:
                log.warning("value left out of pool", extra={"node": node, "reason": reason})
            digests = tuple(content_hash(part) for part in content.slices)
            self._built[node] = (inputs, digests)
        plan = plan_pool(content, owner=owner, stored=stored, digests=digests)
        if plan.unchanged:
            POOL_WRITES.labels("unchanged").inc()
            if content is not None:
                await self._announce(node, taints, _generation(stored))
            return
        if tagging and info is not None and info.traceparent:
            with self._tracer.start_as_current_span(
                "tag ResourceSlices",
                context=context_from_traceparent(info.traceparent),
                attributes={
                    "k8s.node.name": node,
                    "neuron.workload.id": info.workload_id,
                    "neuron.pool.generation": plan.generation,
                    "neuron.slices": len(plan.writes),
                },
            ):
                await self._write(node, plan)
        else:
            await self._write(node, plan)
        if content is not None:
            await self._announce(node, taints, plan.generation)

    async def _announce(self, node: str, taints: _Taints, generation: int) -> None:
        """Report the node's taint changes, now that its stored pool carries them."""
        await self.announcer.announce(node, dict(taints), health=self.health, generation=generation)

    async def _write(self, node: str, plan: Plan) -> None:
        held = self.stored.setdefault(node, {})
        for write in plan.writes:
            if write.resource_version:
                obj = await self.store.replace(
                    write.name, write.body, resource_version=write.resource_version
                )
            else:
                obj = await self.store.create(write.body)
            held[write.name] = stored_slice(obj)
        for name in plan.deletes:
            await self.store.delete(name)
            held.pop(name, None)
        if not held:
            self.stored.pop(node, None)
        POOL_WRITES.labels("written" if plan.writes else "deleted").inc()
        self.generations[node] = plan.generation
        log.info(
            "pool written",
            extra={
                "node": node,
                "generation": plan.generation,
                "slices": len(plan.writes),
                "deleted": len(plan.deletes),
            },
        )
        if self.on_written is not None:
            self.on_written(node, plan.generation)


def _generation(stored: list[StoredSlice]) -> int:
    return max((s.generation for s in stored), default=0)


def _without_statistics(inventory: NodeInventory) -> NodeInventory:
    """``inventory`` without its ECC and per-core counters, which no slice shows.

    They are most of an inventory's objects: held for every node and compared on every
    reconcile they would only cost memory, garbage-collector scans and time.
    """
    hardware = inventory.hardware
    if not any(d.cores or d.ecc != _NO_ECC for d in hardware.devices):
        return inventory
    devices = tuple(msgspec.structs.replace(d, ecc=_NO_ECC, cores=()) for d in hardware.devices)
    return msgspec.structs.replace(
        inventory, hardware=msgspec.structs.replace(hardware, devices=devices)
    )


_NO_ECC = EccCounters()


def _as_int(version: str) -> int | None:
    return int(version) if version.isdigit() else None


def _newer(a: str, b: str) -> bool:
    """``a`` is a later resourceVersion than ``b`` (etcd revisions; unknown forms: differ)."""
    x, y = _as_int(a), _as_int(b)
    if x is None or y is None:
        return a != b
    return x > y


def _not_older(held: str, seen: str) -> bool:
    x, y = _as_int(held), _as_int(seen)
    if x is None or y is None:
        return True
    return y >= x
