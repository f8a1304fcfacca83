"""The three extender verbs over the ledger: filter and prioritize decide from what is known;
bind chooses the set, reserves it and binds the pod with it in its annotations.

kube-scheduler binds asynchronously: once it has chosen a node for one pod it sends ``bind``
and goes on to filter the next pod at once. Whatever bind reserves only after an API call is
unknown to those next filters, which then offer the same devices again (and best fit steers
the next pods to the very node just filled): their binds find the devices gone and are
refused, and each refused pod waits out the scheduler's back-off. So bind reserves as soon as
the call arrives, before its first await, from the pod as the extender's pod watch last showed
it; only a pod the watch has not shown yet is read from the API first. Bind never trusts a pod
a caller sent (a filter body could say anything): what the pod asks for, and whether it asks
for Neuron devices at all, is the API's word. The reservation is a check-and-set in
the ledger with no await in it: two binds racing for the last free set cannot both get it,
the second is answered with an error and kube-scheduler tries the pod again. A bind whose set
seen at filter time is gone takes any other free valid set on the node.

The binding carries the annotations (the API server merges a Binding's annotations into the
pod as it sets ``spec.nodeName``): one API call per bind, and no pod is ever annotated but
left unbound, or bound without its devices. Kubernetes is reached through :class:`Cluster`
(see ``cluster.py``), so this module is tested with a fake one.
"""

from __future__ import annotations

import logging
import operator
import time
from collections.abc import Callable, Mapping
from itertools import compress, repeat
from typing import Protocol

import msgspec
from neuron_dra_common.extended import ANNOTATION_IDS
from neuron_dra_common.telemetry import Counter, Histogram
from neuron_dra_common.topology import UnknownInstanceType

from neuron_dra_scheduler_extender.api import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    HostPriority,
    NodeList,
    NodeView,
    PodView,
    decode_node,
)
from neuron_dra_scheduler_extender.decide import Unfit, Usage, judge, verdict
from neuron_dra_scheduler_extender.inflight import BIND_GRACE, InFlight
from neuron_dra_scheduler_extender.inputs import Ask, AskError, NodeShape, ask_of, shape_of
from neuron_dra_scheduler_extender.ledger import (
    Allocation,
    Conflict,
    Ledger,
    allocation_of,
    annotations_for,
    format_ids,
)
from neuron_dra_scheduler_extender.verdicts import Verdict, Verdicts

__all__ = ["NOT_MANAGED", "Cluster", "Extender", "NotManaged"]

log = logging.getLogger(__name__)

DECISIONS = Counter(
    "neuron_dra_extender_decisions_total",
    "Extender answers by verb and outcome",
    ["verb", "outcome"],
)
LATENCY = Histogram(
    "neuron_dra_extender_decision_seconds",
    "Time to answer one extender call (bind: including the API calls)",
    ["verb"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)


_WHY = operator.itemgetter(0)
_PRIORITY = operator.itemgetter(1)
#: A node the extender has not seen yet (its informer is behind the scheduler's).
_NOT_SEEN = Unfit(message="node(s) were not known to the Neuron extender yet", final=False)
#: Why a pod that asks for no Neuron device or core is neither placed nor bound: binding it
#: would let whoever calls the extender send any pending pod (and so its Secrets) to any node.
NOT_MANAGED = (
    "the pod asks for no aws.amazon.com/neuron, aws.amazon.com/neurondevice or "
    "aws.amazon.com/neuroncore, and the Neuron extender places and binds only pods that do"
)
_NOT_MANAGED_NODES = f"node(s) were not offered: {NOT_MANAGED}"


class NotManaged(Exception):
    """A bind for a pod the extender does not place."""


class Cluster(Protocol):
    """What the extender needs of Kubernetes."""

    def node_views(self) -> Mapping[str, NodeView]:
        """Every node as last seen, by name (read, never changed, by the extender): filter
        and prioritize look up a thousand nodes at once in it, without a call per node."""

    def known_pod(self, namespace: str, name: str) -> PodView | None:
        """The pod as the pod watch last showed it (None: not shown yet)."""

    async def get_pod(self, namespace: str, name: str) -> PodView: ...

    async def bind(
        self, namespace: str, name: str, *, uid: str, node: str, annotations: dict[str, str]
    ) -> None:
        """Bind the pod to ``node`` and merge ``annotations`` into its own, in one step, only
        if its uid is ``uid``."""


class Extender:
    """Answers kube-scheduler's ``filter``, ``prioritize`` and ``bind`` calls."""

    def __init__(
        self,
        cluster: Cluster,
        *,
        clock_ns: Callable[[], int] = time.time_ns,
        bind_grace: float = BIND_GRACE,
    ) -> None:
        self.cluster = cluster
        self.ledger = Ledger()
        self._clock_ns = clock_ns
        # Pods offered a node by the filter whose bind has not arrived yet (see inflight.py).
        self.inflight = InFlight(grace=bind_grace)
        # Reservations made by bind that the pod watch has not shown annotated yet: an older
        # view of the pod (without the annotation) must not free them.
        self._pending: set[str] = set()
        # Per node, what the filter reads on every call: the node's shape (until the Node
        # changes) and its usage (until its allocations change).
        self._shapes: dict[str, tuple[NodeView, NodeShape]] = {}
        self._usages: dict[str, tuple[int, NodeShape, Usage]] = {}
        # Per kind of request, each node's verdict until the node or its allocations change:
        # most nodes do not change between two calls, so most verdicts are looked up, not made.
        self.verdicts = Verdicts(self.ledger, self.fresh_verdict)

    def _shape(self, view: NodeView) -> NodeShape:
        name = view.metadata.name
        cached = self._shapes.get(name)
        if cached is not None and (cached[0] is view or cached[0] == view):
            return cached[1]
        shape = shape_of(view)
        self._shapes[name] = (view, shape)
        return shape

    def usage(self, shape: NodeShape) -> Usage:
        """``shape``'s node as the ledger has it now."""
        stamp = self.ledger.stamp(shape.name)
        cached = self._usages.get(shape.name)
        if cached is not None and cached[0] == stamp and cached[1] is shape:
            return cached[2]
        usage = Usage(shape, self.ledger.used(shape))
        self._usages[shape.name] = (stamp, shape, usage)
        return usage

    # -- what the pod watch tells ------------------------------------------------------------

    def observe(self, pod: PodView, *, deleted: bool = False) -> None:
        """Bring the ledger in line with ``pod`` as the API shows it."""
        uid = pod.metadata.uid
        if deleted:
            self._pending.discard(uid)
            self.ledger.release(uid)
            return
        try:
            ask = ask_of(pod)
        except AskError:
            ask = None
        alloc = allocation_of(pod, ask=ask)
        if alloc is not None:
            self._pending.discard(uid)
            self.ledger.record(alloc)
        elif pod.status.phase in ("Succeeded", "Failed"):
            self._pending.discard(uid)
            self.ledger.release(uid)
        elif uid not in self._pending:
            self.ledger.release(uid)

    # -- filter and prioritize -----------------------------------------------------------------

    async def settle(self, pod: PodView) -> None:
        """Before ``pod``'s filter: let the binds due from earlier filters arrive first, so
        that the filter sees the devices they take (see ``inflight.py``)."""
        await self.inflight.settle(pod.metadata.uid)

    def _candidates(self, args: ExtenderArgs) -> tuple[list[str], list[NodeView | None]]:
        """The nodes asked about: their names, and each as last seen (None: not known)."""
        if args.nodes is not None:
            views = [decode_node(raw) for raw in args.nodes.items]
            return [v.metadata.name for v in views], list[NodeView | None](views)
        names = list(args.node_names or ())
        return names, list(map(self.cluster.node_views().get, names))

    def fresh_verdict(self, ask: Ask, name: str, view: NodeView | None) -> Verdict:
        """Why ``ask`` does not fit node ``name`` (seen as ``view``) now (None: it fits),
        and prioritize's answer for the node, worked out from the ledger as it is: what
        :attr:`verdicts` keeps."""
        nothing = HostPriority(host=name, score=0)
        if view is None:
            return _NOT_SEEN, nothing
        try:
            shape = self._shape(view)
        except UnknownInstanceType as exc:
            return Unfit(message=f"node(s) were not Neuron nodes: {exc}", final=True), nothing
        why, value = verdict(shape, ask, self.usage(shape))
        return why, HostPriority(host=name, score=value)

    def filter(self, args: ExtenderArgs) -> ExtenderFilterResult:
        """The nodes that can give the pod a valid connected set now; the others with why."""
        t0 = time.perf_counter()
        names, views = self._candidates(args)
        result = ExtenderFilterResult()
        failed, final = result.failed_nodes, result.failed_and_unresolvable_nodes
        fit: list[bool] = []
        try:
            ask = ask_of(args.pod)
        except AskError as exc:
            result.failed_and_unresolvable_nodes = {name: str(exc) for name in names}
            ask = None
        else:
            if ask is None:
                final.update(dict.fromkeys(names, _NOT_MANAGED_NODES))
                fit = [False] * len(names)
            else:
                # In C but for the nodes that do not fit: this runs for every node.
                whys = list(map(_WHY, self.verdicts.lookup(ask, names, views)))
                fit = list(map(operator.is_, whys, repeat(None)))
                for name, why in compress(zip(names, whys, strict=True), map(operator.not_, fit)):
                    (final if why.final else failed)[name] = why.message
        if args.nodes is not None:
            result.nodes = NodeList(items=list(compress(args.nodes.items, fit)))
        else:
            result.node_names = list(compress(names, fit))
        kept = fit.count(True)
        if kept:
            self.inflight.expect(args.pod.metadata.uid)
        log.info(
            "filtered nodes",
            extra={
                "pod": args.pod.key,
                "ask": None if ask is None else f"{ask.count} {ask.resource}",
                "fit": kept,
                "failed": len(result.failed_nodes) + len(result.failed_and_unresolvable_nodes),
                # One reason is enough to read: on a large cluster the rest repeat it.
                "reason": next(
                    iter(result.failed_and_unresolvable_nodes.values()),
                    next(iter(result.failed_nodes.values()), ""),
                ),
            },
        )
        DECISIONS.labels("filter", "fit" if kept else "none").inc()
        LATENCY.labels("filter").observe(time.perf_counter() - t0)
        return result

    def prioritize(self, args: ExtenderArgs) -> list[HostPriority]:
        """0..10 per node: fuller after placing scores higher (best fit)."""
        t0 = time.perf_counter()
        try:
            ask = ask_of(args.pod)
        except AskError:
            ask = None
        names, views = self._candidates(args)
        if ask is None:
            out = [HostPriority(host=name, score=0) for name in names]
        else:
            out = list(map(_PRIORITY, self.verdicts.lookup(ask, names, views)))
        DECISIONS.labels("prioritize", "ok").inc()
        LATENCY.labels("prioritize").observe(time.perf_counter() - t0)
        return out

    # -- bind --------------------------------------------------------------------------------

    async def bind(self, args: ExtenderBindingArgs) -> ExtenderBindingResult:
        """Choose the set on ``args.node``, annotate the pod with it, bind the pod."""
        t0 = time.perf_counter()
        outcome = "bound"
        try:
            result = await self._bind(args)
        except NotManaged as exc:
            log.warning(
                "bind refused: the pod is not one the extender places",
                extra={
                    "pod": f"{args.pod_namespace}/{args.pod_name}",
                    "node": args.node,
                    "error": str(exc),
                },
            )
            outcome = "refused"
            result = ExtenderBindingResult(
                error=f"Pod {args.pod_namespace}/{args.pod_name} not bound to node {args.node}: "
                f"{exc}"
            )
        except Exception as exc:  # every failure is the scheduler's to retry, with the reason
            log.warning(
                "bind failed",
                extra={
                    "pod": f"{args.pod_namespace}/{args.pod_name}",
                    "node": args.node,
                    "error": str(exc),
                },
            )
            outcome = "error"
            result = ExtenderBindingResult(
                error=f"Pod {args.pod_namespace}/{args.pod_name} on node {args.node}: {exc}"
            )
        # Bound, refused or failed: nothing more is to come of this pod's filter.
        self.inflight.arrived(args.pod_uid)
        DECISIONS.labels("bind", outcome).inc()
        LATENCY.labels("bind").observe(time.perf_counter() - t0)
        return result

    async def _bind(self, args: ExtenderBindingArgs) -> ExtenderBindingResult:
        ns, name, node = args.pod_namespace, args.pod_name, args.node
        pod = self.cluster.known_pod(ns, name)
        if pod is None or (args.pod_uid and pod.metadata.uid != args.pod_uid):
            # Not shown by the pod watch yet (or replaced since it last did): read it.
            pod = await self.cluster.get_pod(ns, name)
            if args.pod_uid and pod.metadata.uid != args.pod_uid:
                raise LookupError(
                    f"the pod's uid is {pod.metadata.uid}, not {args.pod_uid} (it was replaced)"
                )
        uid = pod.metadata.uid
        ask = ask_of(pod)
        if ask is None:
            raise NotManaged(NOT_MANAGED)
        view = self.cluster.node_views().get(node)
        if view is None:
            raise LookupError("the node is not known to the Neuron extender yet")
        alloc, before = self._reserve(pod, ask, self._shape(view))
        # Reserved with no await since the call arrived: the filters waiting for this bind
        # may decide now.
        self.inflight.arrived(uid)
        try:
            annotations = annotations_for(
                ask=ask, ids=alloc.ids, node=node, now_ns=self._clock_ns()
            )
            await self.cluster.bind(ns, name, uid=uid, node=node, annotations=annotations)
        except BaseException:
            self._undo(alloc, before)
            raise
        log.info(
            "bound pod",
            extra={
                "pod": pod.key,
                "node": node,
                "resource": ask.resource,
                "ids": format_ids(alloc.ids),
            },
        )
        return ExtenderBindingResult()

    def _reserve(
        self, pod: PodView, ask: Ask, shape: NodeShape
    ) -> tuple[Allocation, Allocation | None]:
        """Check and set, with no await in between: the ledger's view cannot change here.
        Returns the reservation and what the ledger held for the pod before it."""
        uid = pod.metadata.uid
        held = self.ledger.get(uid)
        if (
            held is not None
            and held.node == shape.name
            and pod.metadata.annotations.get(ANNOTATION_IDS) == format_ids(held.ids)
        ):
            # A bind tried again after a lost answer: the pod keeps what it was given.
            self._pending.add(uid)
            return held, held
        used = self.ledger.used(shape, excluding=uid)
        verdict = judge(shape, ask, used)
        if isinstance(verdict, Unfit):
            raise Conflict(verdict.message)
        ids = verdict.cores if ask.cores else verdict.devices
        alloc = Allocation(uid=uid, pod=pod.key, node=shape.name, cores=ask.cores, ids=ids)
        self.ledger.reserve(alloc, shape)
        self._pending.add(uid)
        return alloc, held

    def _undo(self, alloc: Allocation, before: Allocation | None) -> None:
        """A binding the API refused: the pod holds again what it held before, if the ledger
        still has this bind's reservation (the watch may have told better since)."""
        uid = alloc.uid
        self._pending.discard(uid)
        if self.ledger.get(uid) != alloc:
            return
        if before is not None and before != alloc:
            self.ledger.record(before)
        elif before is None:
            self.ledger.release(uid)


def decode_pod(obj: object) -> PodView:
    """A Pod from the API (a decoded JSON object) as the extender reads it."""
    return msgspec.convert(obj, PodView)
