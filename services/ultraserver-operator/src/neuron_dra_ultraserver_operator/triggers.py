"""Which keys to reconcile when the informers report a change.

- a workload changed: that workload, and the NeuronUltraServers it holds;
- a Node or slice changed what discovery reads: after a short settle, every UltraServer, the
  workloads holding the touched nodes, and (for Nodes) every waiting workload;
- a Node changed only otherwise (its allocation record): the workloads holding it and its
  NeuronUltraServer;
- a NeuronUltraServer changed: that UltraServer;
- the bus says a node was lost or recovered, or a device failed or was repaired: the
  workloads holding the node, and (when it is back) every waiting workload.

Which workloads hold a node is kept in an index (:class:`Holders`) fed by the workload
events, so a Node event costs a lookup, not a scan of every workload.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any, Final

from neuron_dra_common.kube import EventType, WorkQueue, object_key

from neuron_dra_ultraserver_operator.fleet import Fleet, FleetIndex
from neuron_dra_ultraserver_operator.metrics import WorkloadStates

__all__ = ["FLEET_SETTLE_SECONDS", "Holders", "Triggers"]

#: How long a burst of Node and slice changes may grow before the views are recomputed.
FLEET_SETTLE_SECONDS: Final = 0.05
#: The states of a workload that waits for capacity to come back (a partially allocated one
#: may wait for a replacement).
_WAITING: Final = ("", "Pending", "PartiallyAllocated")

Obj = dict[str, Any]


class Holders:
    """node name -> the keys of the workloads whose status allocates it."""

    def __init__(self) -> None:
        self._nodes_of: dict[str, frozenset[str]] = {}
        self._holders: dict[str, set[str]] = {}

    def update(self, key: str, obj: Obj | None) -> None:
        """``key`` now holds what ``obj``'s status records (``None``: nothing, it is gone)."""
        nodes = frozenset(_allocated_nodes(obj)) if obj is not None else frozenset()
        before = self._nodes_of.get(key, frozenset())
        if nodes == before:
            return
        for node in before - nodes:
            keys = self._holders.get(node)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._holders[node]
        for node in nodes - before:
            self._holders.setdefault(node, set()).add(key)
        if nodes:
            self._nodes_of[key] = nodes
        else:
            self._nodes_of.pop(key, None)

    def of(self, node: str) -> tuple[str, ...]:
        return tuple(sorted(self._holders.get(node, ())))


class Triggers:
    """The informers' listeners: each change queues the keys it concerns."""

    def __init__(
        self,
        *,
        workloads: Mapping[str, Obj],
        fleet: Fleet,
        index: FleetIndex,
        workload_queue: WorkQueue[str],
        ultraserver_queue: WorkQueue[str],
    ) -> None:
        self._workloads = workloads
        self._fleet = fleet
        self._index = index
        self._wq = workload_queue
        self._uq = ultraserver_queue
        self.holders = Holders()
        self._states = WorkloadStates()
        # A burst of Node and slice events (a node group scaling, the publisher writing every
        # pool) is taken in one pass a moment later: one recompute of the views, each
        # UltraServer and each affected workload queued once, instead of a pass per event.
        self._touched: set[str] = set()
        self._nodes_touched = False
        self._flush: asyncio.TimerHandle | None = None

    # --- hooks of the workload reconciler ----------------------------------------------------

    def ultraservers_changed(self, names: Iterable[str]) -> None:
        for name in names:
            self._uq.add(name)

    def capacity_released(self) -> None:
        """Capacity came back: every workload that waits gets another look, oldest first."""
        items = sorted(
            self._workloads.values(),
            key=lambda o: str((o.get("metadata") or {}).get("creationTimestamp") or ""),
        )
        for obj in items:
            if ((obj.get("status") or {}).get("state") or "") in _WAITING:
                self._wq.add(object_key(obj))

    # --- informer listeners ------------------------------------------------------------------

    def on_workload(self, kind: EventType, obj: Obj) -> None:
        key = object_key(obj)
        gone = kind == "DELETED"
        self.holders.update(key, None if gone else obj)
        self._states.update(key, None if gone else str(_status(obj).get("state") or ""))
        self._wq.add(key)
        for alloc in _status(obj).get("allocations") or ():
            self._uq.add(str(alloc.get("ultraServer")))

    def on_node(self, kind: EventType, obj: Obj) -> None:
        if self._fleet_changed(kind, obj):
            self._nodes_touched = True
            return
        # Only the node record (or nothing discovery reads) changed: the workloads that hold
        # the node look again, and so does its NeuronUltraServer's status.
        name = str((obj.get("metadata") or {}).get("name"))
        self._holding(name)
        if self._fleet.stale:
            return  # the pending pass queues every UltraServer
        ultraserver = self._index.ultraserver_of(name)
        if ultraserver is not None:
            self._uq.add(ultraserver)

    def on_slice(self, kind: EventType, obj: Obj) -> None:
        self._fleet_changed(kind, obj)

    def on_node_health(self, node: str, failed: bool) -> None:
        """The failure detector or a device changed whether ``node`` is failed: the
        workloads holding it look again; a node back in service is capacity for the waiting."""
        self._holding(node)
        ultraserver = None if self._fleet.stale else self._index.ultraserver_of(node)
        if ultraserver is not None:
            self._uq.add(ultraserver)
        if not failed:
            self.capacity_released()

    def on_ultraserver(self, kind: EventType, obj: Obj) -> None:
        self._uq.add(str((obj.get("metadata") or {}).get("name")))

    # --- the settled pass --------------------------------------------------------------------

    def _fleet_changed(self, kind: EventType, obj: Obj) -> bool:
        """A Node or slice event: True when it changed what discovery reads."""
        if not self._fleet.changed(object_key(obj), None if kind == "DELETED" else obj):
            return False
        node = (obj.get("spec") or {}).get("nodeName") or (obj.get("metadata") or {}).get("name")
        self._touched.add(str(node))
        if self._flush is None:
            loop = asyncio.get_running_loop()
            self._flush = loop.call_later(FLEET_SETTLE_SECONDS, self._settled)
        return True

    def _settled(self) -> None:
        self._flush = None
        names, touched, wake = self._fleet(), sorted(self._touched), self._nodes_touched
        self._touched.clear()
        self._nodes_touched = False
        for name in names:
            self._uq.add(name)
        for node in touched:
            self._holding(node)
        if wake:
            self.capacity_released()

    def _holding(self, node: str) -> None:
        for key in self.holders.of(node):
            self._wq.add(key)


def _status(obj: Obj) -> Obj:
    status: Obj = obj.get("status") or {}
    return status


def _allocated_nodes(obj: Obj) -> Iterable[str]:
    for alloc in _status(obj).get("allocations") or ():
        for node in alloc.get("nodes") or ():
            if node.get("nodeName"):
                yield str(node["nodeName"])
