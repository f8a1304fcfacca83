"""NeuronUltraServerWorkload reconcile: Pending -> Allocating -> Allocated, and the cascade.

Level-triggered: each pass reads the workload from the informer's cache and does whatever is
still missing, in an order that makes a crash at any point safe to resume:

1. the allocator grants (idempotent per workload UID, recorded on the bus);
2. the grant is recorded in the workload's status (state Allocating);
3. every node gets its allocation record, first ``Pending``, then, once all have it, ``Bound``
   (the kubelet plugin prepares only ``Bound`` nodes, so no pod starts on half a gang);
4. the ResourceClaimTemplate is applied; 5. the state becomes Allocated.

An Allocated workload is re-asserted to the allocator on every pass (same nodes), so the
allocator's view converges on what the CRs record even after it lost its history.
Deleting a workload (a finalizer holds it) deletes the template and the pods using it, waits
until their claims are gone, removes the node records, releases the nodes, then lets go.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, Protocol

import msgspec
from neuron_dra_common.events import (
    AllocationDecided,
    AllocationReleased,
    AllocationRequested,
    AnyEvent,
    Event,
    ObjectRef,
)
from neuron_dra_common.kube import RESOURCE_CLAIMS, ApiException, KubeClient, apply
from neuron_dra_common.ultraserver import WORKLOAD_UID_LABEL, NodeAllocation, node_allocation

from neuron_dra_ultraserver_operator.discovery import Member, UltraServerView
from neuron_dra_ultraserver_operator.faults import CrashPoint, no_crash
from neuron_dra_ultraserver_operator.manifests import claim_template
from neuron_dra_ultraserver_operator.model import (
    FIELD_MANAGER,
    PODS,
    RESOURCE_CLAIM_TEMPLATES,
    AllocationRecord,
    Workload,
    workload_from_api,
)
from neuron_dra_ultraserver_operator.records import (
    node_allocations,
    records_from_grants,
    topo0_host,
)
from neuron_dra_ultraserver_operator.replacing import replace_affected
from neuron_dra_ultraserver_operator.writes import Writer, now

__all__ = ["Allocate", "WorkloadReconciler"]

log = logging.getLogger(__name__)

Obj = dict[str, Any]
PENDING_RETRY_SECONDS = 10.0
#: States in which a workload holds no nodes and waits for capacity.
WAITING = ("", "Pending", "Allocating", "Failed")


class Allocate(Protocol):
    async def __call__(self, event: Event) -> AnyEvent: ...


class WorkloadReconciler:
    def __init__(
        self,
        *,
        client: KubeClient,
        workloads: Mapping[str, Obj],
        nodes: Mapping[str, Obj],
        fleet: Callable[[], Mapping[str, UltraServerView]],
        allocate: Allocate,
        changed: Callable[[Iterable[str]], None],
        requeue: Callable[[str, float], None],
        released: Callable[[], None],
        claim_wait_seconds: float = 300.0,
        crash: CrashPoint = no_crash,
    ) -> None:
        self.client = client
        self.writer = Writer(client)
        self._workloads = workloads
        self._nodes = nodes
        self._fleet = fleet
        self._allocate = allocate
        self._changed = changed
        self._requeue = requeue
        self._released = released
        self._claim_wait = claim_wait_seconds
        self._crash = crash
        self._indexed: (
            tuple[Mapping[str, UltraServerView], dict[str, Member], dict[str, str]] | None
        ) = None

    # --- helpers -------------------------------------------------------------------------

    def _by_node(self) -> tuple[dict[str, Member], dict[str, str]]:
        # Discovery hands out the same mapping until the fleet changes: index it once per
        # change, not on every reconcile.
        views = self._fleet()
        if self._indexed is None or self._indexed[0] is not views:
            members = {m.node_name: m for v in views.values() for m in v.members}
            names = {m.node_name: v.name for v in views.values() for m in v.members}
            self._indexed = (views, members, names)
        return self._indexed[1], self._indexed[2]

    def _members(self) -> dict[str, Member]:
        return self._by_node()[0]

    def _names(self) -> dict[str, str]:
        return self._by_node()[1]

    async def _ask(
        self, wl: Workload, *, nodes: tuple[str, ...] = (), exclude: tuple[str, ...] = ()
    ) -> AllocationDecided:
        answer = await self._allocate(
            AllocationRequested(
                request_id=f"{wl.metadata.uid}-{wl.metadata.generation}",
                workload=ObjectRef(
                    namespace=wl.metadata.namespace, name=wl.metadata.name, uid=wl.metadata.uid
                ),
                topology_size=wl.spec.topology_size,
                server_count=wl.spec.server_count,
                instance_type=wl.spec.instance_type,
                generation=wl.metadata.generation,
                nodes=nodes,
                exclude_ultraservers=exclude,
            )
        )
        if not isinstance(answer, AllocationDecided):
            raise TypeError(f"{wl}: the allocator answered {answer.event_type()}")
        return answer

    async def _release(self, wl: Workload) -> None:
        await self._allocate(
            AllocationReleased(
                request_id=f"release-{wl.metadata.uid}",
                workload=ObjectRef(
                    namespace=wl.metadata.namespace, name=wl.metadata.name, uid=wl.metadata.uid
                ),
            )
        )

    def _status(
        self,
        wl: Workload,
        *,
        state: str,
        reason: str,
        message: str,
        records: tuple[AllocationRecord, ...] = (),
        allocation_time: str = "",
    ) -> Obj:
        allocated = state in ("Allocated", "PartiallyAllocated")
        status: Obj = {
            "state": state,
            "reason": reason,
            "message": message,
            "workloadId": wl.metadata.name,
            "allocatedUltraServers": list(dict.fromkeys(r.ultra_server for r in records)),
            "totalNodesAllocated": sum(len(r.nodes) for r in records),
            "allocations": [msgspec.to_builtins(r) for r in records],
            "observedGeneration": wl.metadata.generation,
            "conditions": [
                {
                    "type": "Allocated",
                    "status": "True" if allocated else "False",
                    "reason": reason,
                    "message": message[:1024],
                    "lastTransitionTime": self._since(wl, "Allocated", allocated),
                    "observedGeneration": wl.metadata.generation,
                }
            ],
        }
        if records:
            status["topology0Host"] = topo0_host(records)
        if allocated:
            status["resourceClaimTemplate"] = wl.template_name
        if allocation_time:
            status["allocationTime"] = allocation_time
        return status

    def _since(self, wl: Workload, kind: str, value: bool) -> str:
        raw = self._workloads.get(wl.key) or {}
        for cond in (raw.get("status") or {}).get("conditions") or ():
            if cond.get("type") == kind and (cond.get("status") == "True") == value:
                return str(cond.get("lastTransitionTime") or now())
        return now()

    async def _set(self, wl: Workload, status: Obj) -> bool:
        """Write ``status`` unless the workload already shows it; True when written."""
        current = (self._workloads.get(wl.key) or {}).get("status") or {}
        if {k: v for k, v in current.items() if k != "conditions"} == {
            k: v for k, v in status.items() if k != "conditions"
        }:
            return False
        await self.writer.status(wl, status)
        self._changed(r.ultra_server for r in wl.status.allocations)
        self._changed(a["ultraServer"] for a in status.get("allocations") or ())
        return True

    # --- reconcile -----------------------------------------------------------------------

    async def reconcile(self, key: str) -> None:
        obj = self._workloads.get(key)
        if obj is None:
            return
        try:
            wl = workload_from_api(obj)
        except msgspec.ValidationError as exc:
            log.error("workload not readable", extra={"workload": key, "error": str(exc)})
            return
        if wl.metadata.deletion_timestamp:
            await self._deallocate(wl)
            return
        if "neuron.aws.com/ultraserver-operator" not in wl.metadata.finalizers:
            await self.writer.finalizer(wl, present=True)
        records = wl.status.allocations
        if records and not _same_shape(wl, records):
            await self.writer.event(
                wl, reason="Reallocating", message="spec changed: releasing and placing again"
            )
            await self._unbind(wl, records)
            await self._set(
                wl, self._status(wl, state="Allocating", reason="SpecChanged", message="")
            )
            return
        if not records:
            await self._allocate_new(wl)
            return
        decided = await self._ask(wl, nodes=wl.nodes)
        if not decided.granted:
            await self._set(
                wl,
                self._status(
                    wl, state="Failed", reason="Conflict", message=decided.reason, records=records
                ),
            )
            await self.writer.event(wl, reason="Conflict", message=decided.reason, warning=True)
            return
        await self._bind(wl, records)

    async def _allocate_new(self, wl: Workload) -> None:
        # The allocator answers within milliseconds: the first state a new workload shows is
        # its answer (Allocating with the nodes it got, or Pending with why), one write less
        # on the way to Allocated.
        decided = await self._ask(wl)
        if not decided.granted:
            await self._set(
                wl,
                self._status(
                    wl, state="Pending", reason="InsufficientCapacity", message=decided.reason
                ),
            )
            await self.writer.event(
                wl, reason="AllocationPending", message=decided.reason, warning=True
            )
            self._requeue(wl.key, PENDING_RETRY_SECONDS)
            return
        self._crash("allocate:granted")
        records = records_from_grants(decided.grants, names=self._names())
        # Recorded before any node is touched: a crash after this resumes from the status.
        await self._set(
            wl,
            self._status(
                wl,
                state="Allocating",
                reason="Binding",
                message="nodes " + ", ".join(decided.nodes),
                records=records,
            ),
        )
        self._crash("allocate:recorded")
        wl = msgspec.structs.replace(
            wl, status=msgspec.structs.replace(wl.status, allocations=records, state="Allocating")
        )
        await self._bind(wl, records)

    def _recorded(self, node: str) -> Any:
        meta = (self._nodes.get(node) or {}).get("metadata") or {}
        try:
            return node_allocation(node, meta.get("annotations"))
        except ValueError:
            return None

    async def _write_nodes(
        self,
        wl: Workload,
        records: tuple[AllocationRecord, ...],
        phase: Literal["Pending", "Bound"],
    ) -> None:
        async def write(node: str, record: NodeAllocation) -> None:
            await self.writer.node_record(node, record)
            self._crash(f"allocate:node-{phase.lower()}")

        wanted = []
        for node, record in node_allocations(wl, records, phase=phase).items():
            held = self._recorded(node)
            if held == record:
                continue
            if phase == "Pending" and held == msgspec.structs.replace(record, phase="Bound"):
                continue  # bound before a restart: never step back to Pending
            wanted.append(write(node, record))
        # The nodes of one phase are independent: written together. The phases stay in
        # order (every node Pending before any is Bound).
        await asyncio.gather(*wanted)

    async def _bind(self, wl: Workload, records: tuple[AllocationRecord, ...]) -> None:
        missing = [n for n in wl.nodes if n not in self._nodes]
        unready = [n for n in wl.nodes if n in self._nodes and not _ready(self._nodes[n])]
        bound = wl.status.state in ("Allocated", "PartiallyAllocated")
        if bound and (missing or unready):
            await self._failed_nodes(wl, records, missing + unready)
            return
        if not bound:
            await self._write_nodes(wl, records, "Pending")
        await self._write_nodes(wl, records, "Bound")
        template = claim_template(wl, records, self._members())
        await apply(self.client, RESOURCE_CLAIM_TEMPLATES, template, field_manager=FIELD_MANAGER)
        if not bound:
            self._crash("allocate:template")
        message = (
            f"{len(records)} x {wl.spec.topology_size}-node on "
            + ", ".join(dict.fromkeys(r.ultra_server for r in records))
            + f"; ResourceClaimTemplate {wl.template_name}"
        )
        allocation_time = wl.status.allocation_time or now()
        written = await self._set(
            wl,
            self._status(
                wl,
                state="Allocated",
                reason="Allocated",
                message=message,
                records=records,
                allocation_time=allocation_time,
            ),
        )
        if written:
            self._crash("allocate:allocated")
        await self.writer.event(wl, reason="Allocated", message=message)

    async def _failed_nodes(
        self, wl: Workload, records: tuple[AllocationRecord, ...], nodes: list[str]
    ) -> None:
        strategy = wl.spec.allocation_policy.failure_strategy
        message = f"nodes not ready: {', '.join(sorted(nodes))} (failureStrategy {strategy})"
        await self.writer.event(wl, reason="NodeFailed", message=message, warning=True)
        if strategy == "RestartAll":
            await self._unbind(wl, records)
            await self._set(
                wl, self._status(wl, state="Pending", reason="RestartAll", message=message)
            )
            self._requeue(wl.key, 0.0)
            return
        if strategy in ("ReplaceAffected", "MigrateAffected"):
            refused = await replace_affected(self, wl, records, set(nodes))
            if refused is None:
                return
            message = f"{message}; no replacement: {refused}"
        await self._set(
            wl,
            self._status(
                wl,
                state="PartiallyAllocated",
                reason="NodeFailed",
                message=message,
                records=records,
                allocation_time=wl.status.allocation_time,
            ),
        )

    async def _unbind(
        self, wl: Workload, records: tuple[AllocationRecord, ...], *, deleting: bool = False
    ) -> None:
        for record in records:
            for node in record.nodes:
                held = self._recorded(node.node_name)
                if held is not None and held.workload_uid == wl.metadata.uid:
                    await self.writer.node_record(node.node_name, None)
                    if deleting:
                        self._crash("delete:node-cleared")
        await self._release(wl)
        if deleting:
            self._crash("delete:released")
        self._released()

    async def _deallocate(self, wl: Workload) -> None:
        if "neuron.aws.com/ultraserver-operator" not in wl.metadata.finalizers:
            return
        records = wl.status.allocations
        if wl.status.state != "Deallocating":
            await self._set(
                wl,
                self._status(
                    wl, state="Deallocating", reason="Deleting", message="", records=records
                ),
            )
            self._crash("delete:deallocating")
            await self.writer.event(
                wl,
                reason="Deallocating",
                message="releasing UltraServers and removing the template",
            )
        if await self._delete_template(wl):
            self._crash("delete:template-deleted")
        if await self._claims_remain(wl):
            self._requeue(wl.key, 1.0)
            return
        await self._unbind(wl, records, deleting=True)
        await self.writer.event(wl, reason="Released", message="UltraServers released")
        self.writer.forget(wl.metadata.uid)
        await self.writer.finalizer(wl, present=False)
        self._changed(r.ultra_server for r in records)

    async def _delete_template(self, wl: Workload) -> bool:
        """Delete the workload's template and the pods using it; True if it deleted the
        template."""
        ns, name = wl.metadata.namespace, wl.template_name
        deleted = False
        try:
            rct = await self.client.get(RESOURCE_CLAIM_TEMPLATES, name, namespace=ns)
        except ApiException as exc:
            if exc.status != 404:
                raise
        else:
            labels = (rct.get("metadata") or {}).get("labels") or {}
            if labels.get(WORKLOAD_UID_LABEL) == wl.metadata.uid:
                await _delete(self.client, RESOURCE_CLAIM_TEMPLATES, name, ns)
                deleted = True
        pods, _ = await self.client.list(PODS, namespace=ns)
        for pod in pods:
            claims = (pod.get("spec") or {}).get("resourceClaims") or ()
            if any(c.get("resourceClaimTemplateName") == name for c in claims):
                meta = pod.get("metadata") or {}
                if not meta.get("deletionTimestamp"):
                    await _delete(self.client, PODS, meta.get("name", ""), ns)
        return deleted

    async def _claims_remain(self, wl: Workload) -> bool:
        claims, _ = await self.client.list(
            RESOURCE_CLAIMS,
            namespace=wl.metadata.namespace,
            label_selector=f"{WORKLOAD_UID_LABEL}={wl.metadata.uid}",
        )
        if not claims:
            return False
        started = wl.metadata.deletion_timestamp or now()
        if _age_seconds(started) > self._claim_wait:
            names = ", ".join(sorted((c.get("metadata") or {}).get("name", "") for c in claims))
            await self.writer.event(
                wl,
                reason="ClaimsRemain",
                message=f"claims still present after {self._claim_wait:.0f}s: {names}; releasing",
                warning=True,
            )
            return False
        return True


async def _delete(client: KubeClient, resource: Any, name: str, namespace: str) -> None:
    try:
        await client.delete(resource, name, namespace=namespace)
    except ApiException as exc:
        if exc.status != 404:
            raise


def _same_shape(wl: Workload, records: tuple[AllocationRecord, ...]) -> bool:
    return len(records) == wl.spec.server_count and all(
        len(r.nodes) == wl.spec.topology_size for r in records
    )


def _ready(node: Obj) -> bool:
    for cond in (node.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False


def _age_seconds(stamp: str) -> float:
    from datetime import UTC, datetime

    try:
        then = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return 0.0
    return (datetime.now(UTC) - then).total_seconds()
