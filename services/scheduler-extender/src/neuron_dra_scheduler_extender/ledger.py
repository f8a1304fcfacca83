"""Who holds which Neuron devices and cores, and the pod annotations that record it. Pure.

The annotations are the ones AWS's Neuron device plugin reads in ``Allocate`` to learn which
devices or cores the scheduler extension chose for a pod (AWS's flow: the extension "updates
the POD annotation with allocated neuron core/device Ids", the device plugin "queries the POD
Annotation"). The keys are those that other schedulers write to hand a pod to AWS's device
plugin (HAMi's ``pkg/device/awsneuron``): ``AWS_NEURON_IDS`` (comma-separated device ids for
``aws.amazon.com/neuron``, host-global core ids for ``aws.amazon.com/neuroncore``, as the
seed's log ``Allocated ids for POD nrt-test-5038 are: 0,1,2,3,4,5,6,7,8``),
``NEURON_RESOURCE_TYPE`` (which of the two), ``NEURON_ALLOC_TIME`` (Unix nanoseconds),
``NEURON_ALLOCATED`` (``false`` until the device plugin has served it) and
``aws.amazon.com/predicate-node`` (the node chosen).

The annotations are the only record: at start the ledger is rebuilt from the pods that carry
them, so nothing else needs to survive a restart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec
from neuron_dra_common.extended import (
    ANNOTATION_ALLOCATED,
    ANNOTATION_IDS,
    ANNOTATION_NODE,
    ANNOTATION_RESOURCE,
    ANNOTATION_TIME,
    CORE_RESOURCE,
    DEVICE_RESOURCE,
)

from neuron_dra_scheduler_extender.api import PodView
from neuron_dra_scheduler_extender.inputs import Ask, NodeShape

__all__ = [
    "Allocation",
    "Conflict",
    "Ledger",
    "allocation_of",
    "annotations_for",
    "format_ids",
]


_TERMINAL = ("Succeeded", "Failed")
#: Changes remembered by :meth:`Ledger.changed_since` (then the older half is forgotten).
_MAX_CHANGES = 100_000


class Conflict(Exception):
    """A reservation would hand out a core another pod holds."""


class Allocation(msgspec.Struct, frozen=True, kw_only=True):
    """``pod`` (``namespace/name``, uid ``uid``) holds ``ids`` on ``node``: device ids when
    ``cores`` is false, host-global NeuronCore ids when true."""

    uid: str
    pod: str
    node: str
    cores: bool
    ids: tuple[int, ...]

    def core_ids(self, shape: NodeShape) -> frozenset[int]:
        if self.cores:
            return frozenset(self.ids)
        return frozenset(c for d in self.ids for c in shape.device_cores(d))


def format_ids(ids: Iterable[int]) -> str:
    """``0,1,2``: the annotation's form (AWS's log prints the same)."""
    return ",".join(str(i) for i in ids)


def annotations_for(*, ask: Ask, ids: Iterable[int], node: str, now_ns: int) -> dict[str, str]:
    """The annotations a bound pod carries for the device plugin: ``ids`` are the devices
    chosen, or the cores for a NeuronCore request."""
    return {
        ANNOTATION_IDS: format_ids(ids),
        ANNOTATION_RESOURCE: CORE_RESOURCE if ask.cores else DEVICE_RESOURCE,
        ANNOTATION_TIME: str(now_ns),
        ANNOTATION_ALLOCATED: "false",
        ANNOTATION_NODE: node,
    }


def _ids(text: str) -> tuple[int, ...] | None:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isdigit() for p in parts):
        return None
    return tuple(sorted({int(p) for p in parts}))


def allocation_of(pod: PodView, *, ask: Ask | None = None) -> Allocation | None:
    """What ``pod`` holds according to its annotations, or None (none, unreadable, or the pod
    has finished and holds nothing any more).

    A pod annotated by AWS's own extension may lack ``NEURON_RESOURCE_TYPE``; then ``ask``
    (what the pod asks for) says whether the ids are cores.
    """
    if pod.status.phase in _TERMINAL:
        return None
    annotations: Mapping[str, str] = pod.metadata.annotations
    ids = _ids(annotations.get(ANNOTATION_IDS, ""))
    node = pod.spec.node_name or annotations.get(ANNOTATION_NODE, "")
    if ids is None or not node or not pod.metadata.uid:
        return None
    kind = annotations.get(ANNOTATION_RESOURCE)
    cores = kind == CORE_RESOURCE if kind else bool(ask is not None and ask.cores)
    return Allocation(uid=pod.metadata.uid, pod=pod.key, node=node, cores=cores, ids=ids)


class Ledger:
    """Allocations by node. Observed allocations (from pod annotations) are recorded as they
    are; :meth:`reserve` is the check-and-set that refuses to hand out a used core."""

    def __init__(self) -> None:
        self._by_node: dict[str, dict[str, Allocation]] = {}
        self._by_uid: dict[str, Allocation] = {}
        # A stamp per node, new on every change there: what was computed from a node's
        # allocations stays valid while its stamp is the same.
        self._stamps: dict[str, int] = {}
        self._clock = 0
        # The node of every change since change ``_offset`` (the oldest are dropped): which
        # nodes changed since a clock value, without asking every node for its stamp.
        self._changes: list[str] = []
        self._offset = 0

    def __len__(self) -> int:
        return len(self._by_uid)

    def stamp(self, node: str) -> int:
        """Changes whenever an allocation on ``node`` is recorded or released."""
        return self._stamps.get(node, 0)

    @property
    def clock(self) -> int:
        """Counts the changes so far: a stamp is the clock of its node's last change."""
        return self._clock

    def changed_since(self, clock: int) -> set[str] | None:
        """The nodes whose allocations changed after ``clock`` (a value of :attr:`clock`), or
        None when that is too long ago to tell (then take every node as changed)."""
        start = clock - self._offset
        if start < 0:
            return None
        return set(self._changes[start:])

    def _touch(self, node: str) -> None:
        self._clock += 1
        self._stamps[node] = self._clock
        self._changes.append(node)
        if len(self._changes) > _MAX_CHANGES:
            drop = len(self._changes) // 2
            del self._changes[:drop]
            self._offset += drop

    def get(self, uid: str) -> Allocation | None:
        return self._by_uid.get(uid)

    def on_node(self, node: str) -> tuple[Allocation, ...]:
        return tuple(self._by_node.get(node, {}).values())

    def used(self, shape: NodeShape, *, excluding: str = "") -> frozenset[int]:
        """The cores in use on ``shape``'s node (but those of pod uid ``excluding``)."""
        out: set[int] = set()
        for alloc in self._by_node.get(shape.name, {}).values():
            if alloc.uid != excluding:
                out |= alloc.core_ids(shape)
        return frozenset(out)

    def record(self, alloc: Allocation) -> None:
        """Take ``alloc`` as the truth for its pod (replacing what the pod held)."""
        if self._by_uid.get(alloc.uid) == alloc:
            return  # the watch showing again what is known: nothing changed
        self.release(alloc.uid)
        self._by_node.setdefault(alloc.node, {})[alloc.uid] = alloc
        self._by_uid[alloc.uid] = alloc
        self._touch(alloc.node)

    def reserve(self, alloc: Allocation, shape: NodeShape) -> None:
        """Record ``alloc`` if none of its cores is held by another pod; else raise
        :class:`Conflict` and change nothing."""
        taken = self.used(shape, excluding=alloc.uid) & alloc.core_ids(shape)
        if taken:
            raise Conflict(
                f"Node {shape.name}: cores {format_ids(sorted(taken))} are already allocated"
            )
        self.record(alloc)

    def release(self, uid: str) -> Allocation | None:
        alloc = self._by_uid.pop(uid, None)
        if alloc is not None:
            self._touch(alloc.node)
            node = self._by_node.get(alloc.node, {})
            node.pop(uid, None)
            if not node:
                self._by_node.pop(alloc.node, None)
        return alloc
