"""The operator's view of the fleet, kept over the informers' caches.

:class:`Fleet` runs discovery over the Node and slice caches, again only after a change it
reads; :class:`FleetIndex` turns its UltraServers into the by-node lookups the decider uses,
once per change; :class:`NodeRecords` reads the allocation records the Nodes carry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from neuron_dra_common.ultraserver import NodeAllocationError, node_allocation

from neuron_dra_ultraserver_operator.discovery import (
    Identity,
    Member,
    UltraServerView,
    discover,
    slice_identities,
)
from neuron_dra_ultraserver_operator.inputs import FleetView, Held
from neuron_dra_ultraserver_operator.model import TRACEPARENT

__all__ = ["Fleet", "FleetIndex", "NodeReadiness", "NodeRecords", "node_ready"]

Obj = dict[str, Any]


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


class FleetIndex:
    """By-node lookups over the UltraServers ``views`` returns, rebuilt when they change.

    Discovery hands out the same mapping until the fleet changes: it is indexed once per
    change, not on every reconcile.
    """

    def __init__(
        self,
        views: Callable[[], Mapping[str, UltraServerView]],
        nodes: Mapping[str, Obj],
        failed: Mapping[str, str] | None = None,
    ) -> None:
        self._views = views
        self._ready = NodeReadiness(nodes)
        #: node -> why it failed (lost, an uncorrectable device), read live when asked
        self._failed: Mapping[str, str] = failed if failed is not None else {}
        self._built: tuple[Mapping[str, UltraServerView], FleetView] | None = None

    def view(self) -> FleetView:
        views = self._views()
        if self._built is None or self._built[0] is not views:
            members: dict[str, Member] = {}
            names: dict[str, str] = {}
            server_ids: dict[str, str] = {}
            servers: dict[str, str] = {}
            for us in views.values():
                servers[us.name] = us.server_id
                for member in us.members:
                    members[member.node_name] = member
                    names[member.node_name] = us.name
                    server_ids[member.node_name] = us.server_id
            built = FleetView(
                members=members,
                names=names,
                server_ids=server_ids,
                servers=servers,
                ready=self._ready,
                failed=self._failed,
            )
            self._built = (views, built)
        return self._built[1]

    def ultraserver_of(self, node: str) -> str | None:
        """The NeuronUltraServer ``node`` belongs to, if any."""
        return self.view().names.get(node)


def node_ready(node: Obj) -> bool:
    for cond in (node.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False


class NodeReadiness(Mapping[str, bool]):
    """node name -> whether it is Ready, read from the Node cache when asked."""

    def __init__(self, nodes: Mapping[str, Obj]) -> None:
        self._nodes = nodes

    def __getitem__(self, name: str) -> bool:
        return node_ready(self._nodes[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._nodes)

    def __len__(self) -> int:
        return len(self._nodes)


class NodeRecords(Mapping[str, Held]):
    """node name -> the allocation record it carries, read from the Node cache when asked.

    A node without a record, or with one that cannot be read, is absent.
    """

    def __init__(self, nodes: Mapping[str, Obj]) -> None:
        self._nodes = nodes

    def __getitem__(self, name: str) -> Held:
        annotations = (self._nodes[name].get("metadata") or {}).get("annotations") or {}
        try:
            record = node_allocation(name, annotations)
        except NodeAllocationError:
            record = None
        if record is None:
            raise KeyError(name)
        return Held(record=record, traceparent=str(annotations.get(TRACEPARENT) or ""))

    def __iter__(self) -> Iterator[str]:
        return (name for name in self._nodes if name in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)
