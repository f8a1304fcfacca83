"""One pass over a NeuronUltraServerWorkload: read it, decide, perform.

Level-triggered: each pass reads the workload from the informer's cache and does whatever is
still missing (see ``decide``). A pass that needs an answer (the allocator's, or which claims
remain) decides again with it, until a decision asks nothing more.

Each pass is the root span ``reconcile NeuronUltraServerWorkload`` of its own trace: the
allocator request is its child, and the allocation it writes carries its trace context.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import msgspec
from neuron_dra_common.kube import KubeClient
from neuron_dra_common.telemetry import get_tracer, inject_headers
from opentelemetry import context as otel_context
from opentelemetry.trace import Span, Tracer

from neuron_dra_ultraserver_operator import metrics
from neuron_dra_ultraserver_operator.actions import asks
from neuron_dra_ultraserver_operator.decide import decide
from neuron_dra_ultraserver_operator.efa import RECHECK_SECONDS, EfaCheck
from neuron_dra_ultraserver_operator.executor import Allocate, Executor, Publish
from neuron_dra_ultraserver_operator.faults import CrashPoint, no_crash
from neuron_dra_ultraserver_operator.fleet import FleetIndex, NodeRecords
from neuron_dra_ultraserver_operator.inputs import Facts
from neuron_dra_ultraserver_operator.model import Workload, workload_from_api
from neuron_dra_ultraserver_operator.ownership import owners
from neuron_dra_ultraserver_operator.statuses import stamp

__all__ = ["SPAN_NAME", "WorkloadReconciler"]

log = logging.getLogger(__name__)

SPAN_NAME: Final = "reconcile NeuronUltraServerWorkload"
#: Decisions in one pass at most: ask, then (for a replacement) ask again, then write.
_MOST_DECISIONS: Final = 4

Obj = dict[str, Any]


class WorkloadReconciler:
    """Reconciles workloads by key (``namespace/name``) from the informers' caches."""

    def __init__(
        self,
        *,
        client: KubeClient,
        workloads: Mapping[str, Obj],
        nodes: Mapping[str, Obj],
        fleet: FleetIndex,
        allocate: Allocate,
        changed: Callable[[Iterable[str]], None],
        requeue: Callable[[str, float], None],
        released: Callable[[], None],
        claim_wait_seconds: float = 300.0,
        crash: CrashPoint = no_crash,
        tracer: Tracer | None = None,
        publish: Publish | None = None,
    ) -> None:
        self._workloads = workloads
        self._tracer = tracer or get_tracer(__name__)
        self._fleet = fleet
        self._claim_wait = claim_wait_seconds
        self._efa = EfaCheck(client)
        self._requeue = requeue
        #: key -> (resourceVersion, decoded): each version of a workload decoded once
        self._decoded: dict[str, tuple[str, Workload | None]] = {}
        self._executor = Executor(
            client=client,
            allocate=allocate,
            requeue=requeue,
            wake=released,
            touch=changed,
            crash=crash,
            publish=publish,
            nodes=nodes,
        )
        # The records as the Nodes carry them, this operator's own writes included before
        # the informer shows them: a pass never writes a record again that it just wrote.
        self._records = NodeRecords(self._executor.newest_nodes)

    async def reconcile(self, key: str) -> None:
        cached = self._workloads.get(key)
        if cached is None:
            self._executor.forget(key)
            return
        # The informer may not show this operator's last writes yet.
        obj = self._executor.newest(key, cached)
        try:
            workload = workload_from_api(obj)
        except msgspec.ValidationError as exc:
            log.error("workload not readable", extra={"workload": key, "error": str(exc)})
            return
        attributes = {
            "k8s.namespace.name": workload.metadata.namespace,
            "neuron.workload.name": workload.metadata.name,
        }
        # A root span: a pass is started by the queue, not by whatever ran before it.
        with self._tracer.start_as_current_span(
            SPAN_NAME, context=otel_context.Context(), attributes=attributes
        ) as span:
            try:
                try:
                    await self._pass(workload, traceparent=_traceparent(span))
                finally:
                    await self._executor.sent(workload)
                # serverCount > 1 needs AWS's EFA driver: say on the workload whether it is
                # there, and look again soon while it is not.
                if await self._efa.check(workload, now=stamp()) is False:
                    self._requeue(key, RECHECK_SECONDS)
            except Exception:
                metrics.RECONCILE_ERRORS.inc()
                raise

    def _all_workloads(self) -> list[Workload]:
        out = []
        seen: dict[str, tuple[str, Workload | None]] = {}
        for key, shown in list(self._workloads.items()):
            obj = self._executor.newest(key, shown)
            version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
            cached = self._decoded.get(key)
            if cached is None or cached[0] != version or not version:
                try:
                    cached = (version, workload_from_api(obj))
                except msgspec.ValidationError:
                    cached = (version, None)
            seen[key] = cached
            if cached[1] is not None:
                out.append(cached[1])
        self._decoded = seen
        return out

    async def _pass(self, workload: Workload, *, traceparent: str) -> None:
        facts = Facts(
            now=stamp(),
            traceparent=traceparent,
            claim_wait_seconds=self._claim_wait,
            owners=owners(self._all_workloads(), self._records),
        )
        for _ in range(_MOST_DECISIONS):
            actions = decide(workload, self._fleet.view(), self._records, facts)
            if not actions:
                return
            facts = await self._executor.perform(workload, actions, facts)
            if facts.refused is not None:
                # Decided once more with the refusal, and the pass ends: what it writes
                # (an Event, the status, a release) refuses nothing.
                actions = decide(workload, self._fleet.view(), self._records, facts)
                await self._executor.perform(
                    workload, actions, msgspec.structs.replace(facts, refused=None)
                )
                return
            if not asks(actions):
                return
        log.warning("pass ended undecided", extra={"workload": workload.key})


def _traceparent(span: Span) -> str:
    """The W3C traceparent of ``span`` when it is recorded; else empty."""
    if not span.is_recording():
        return ""
    return inject_headers({}).get("traceparent", "")
