"""What to do next for one NeuronUltraServerWorkload, decided from what is known (no I/O).

A workload goes Pending -> Allocating -> Allocated, and on delete Deallocating -> gone. The
decision lists the writes in an order that makes a crash at any point safe to resume:

1. the allocator grants (idempotent per workload UID, recorded on the bus);
2. the grant is recorded in the workload's status (state Allocating);
3. every node gets its allocation record, first ``Pending``, then, once all have it, ``Bound``
   (the kubelet plugin prepares only ``Bound`` nodes, so no pod starts on half a gang);
4. the ResourceClaimTemplate is applied; 5. the state becomes Allocated.

An Allocated workload is confirmed with the allocator on every pass (same nodes), so its
view converges on what the objects record even after it lost its history. A NotReady or lost
node of an allocated workload applies its ``failureStrategy`` (``NoOp``, ``RestartAll``,
``ReplaceAffected`` alias ``MigrateAffected``: see the README). Deleting a workload (a
finalizer holds it) deletes the template and its pods, waits for their claims to go, removes
the node records, releases the nodes, then lets go.

A pass may need an answer first (the allocator's, or which claims remain): the decision then
ends with that query, and the next decision of the pass gets the answer in :class:`Facts`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import msgspec
from neuron_dra_common.events import AllocationDecided

from neuron_dra_ultraserver_operator.actions import (
    Action,
    ApplyTemplate,
    DeleteTemplate,
    Emit,
    ForgetEvents,
    ListClaims,
    NodeWrite,
    Release,
    RequestAllocation,
    Requeue,
    SetFinalizer,
    TouchUltraServers,
    WakeWaiting,
    WriteNodeRecords,
)
from neuron_dra_ultraserver_operator.inputs import Facts, FleetView, Held
from neuron_dra_ultraserver_operator.manifests import claim_template
from neuron_dra_ultraserver_operator.model import FINALIZER, AllocationRecord, Workload
from neuron_dra_ultraserver_operator.records import node_allocations, records_from_grants
from neuron_dra_ultraserver_operator.statuses import age_seconds, status_write

__all__ = ["BOUND", "PENDING_RETRY_SECONDS", "REPLACING", "decide"]

PENDING_RETRY_SECONDS = 10.0
#: States in which the workload's nodes are recorded Bound.
BOUND = ("Allocated", "PartiallyAllocated")
REPLACING = ("ReplaceAffected", "MigrateAffected")


def decide(
    workload: Workload, fleet: FleetView, records: Mapping[str, Held], facts: Facts
) -> tuple[Action, ...]:
    """The actions that take ``workload`` one pass further; empty when there is nothing to do.

    ``records`` are the allocation records the nodes carry, by node name.
    """
    if workload.metadata.deletion_timestamp:
        return tuple(_deleting(workload, records, facts))
    if facts.answer is None:
        return tuple(_ask(workload, records, facts))
    if not workload.status.allocations:
        return tuple(_placed(workload, fleet, records, facts, facts.answer))
    return tuple(_confirmed(workload, fleet, records, facts, facts.answer))


# --- one step each -------------------------------------------------------------------------


def _ask(workload: Workload, records: Mapping[str, Held], facts: Facts) -> list[Action]:
    out: list[Action] = []
    if FINALIZER not in workload.metadata.finalizers:
        out.append(SetFinalizer(present=True))
    held = workload.status.allocations
    if held and not _same_shape(workload, held):
        out.append(Emit(reason="Reallocating", message="spec changed: releasing and placing again"))
        out += _unbind(workload, records)
        out += status_write(
            workload, now=facts.now, state="Allocating", reason="SpecChanged", message=""
        )
        return out
    if not held:
        out.append(RequestAllocation(purpose="place", step="allocate:granted"))
    else:
        out.append(RequestAllocation(purpose="confirm", nodes=workload.nodes))
    return out


def _placed(
    workload: Workload,
    fleet: FleetView,
    records: Mapping[str, Held],
    facts: Facts,
    answer: AllocationDecided,
) -> list[Action]:
    # The allocator answers within milliseconds: the first state a new workload shows is its
    # answer (Allocating with the nodes it got, or Pending with why).
    if not answer.granted:
        message = answer.reason
        return [
            *status_write(
                workload,
                now=facts.now,
                state="Pending",
                reason="InsufficientCapacity",
                message=message,
            ),
            Emit(reason="AllocationPending", message=message, warning=True),
            Requeue(after=PENDING_RETRY_SECONDS),
        ]
    new = records_from_grants(answer.grants, names=fleet.names)
    # Recorded before any node is touched: a crash after this resumes from the status.
    out = status_write(
        workload,
        now=facts.now,
        state="Allocating",
        reason="Binding",
        message="nodes " + ", ".join(answer.nodes),
        records=new,
        step="allocate:recorded",
    )
    return out + _bind(_holding(workload, new), fleet, records, facts, trace=facts.traceparent)


def _confirmed(
    workload: Workload,
    fleet: FleetView,
    records: Mapping[str, Held],
    facts: Facts,
    answer: AllocationDecided,
) -> list[Action]:
    held = workload.status.allocations
    if not answer.granted:
        return [
            *status_write(
                workload,
                now=facts.now,
                state="Failed",
                reason="Conflict",
                message=answer.reason,
                records=held,
            ),
            Emit(reason="Conflict", message=answer.reason, warning=True),
        ]
    failed = [n for n in workload.nodes if not fleet.ready.get(n, False)]
    if workload.status.state in BOUND and failed:
        return _failed(workload, fleet, records, facts, failed)
    trace = _trace_of(workload, records) or facts.traceparent
    return _bind(workload, fleet, records, facts, trace=trace)


def _bind(
    workload: Workload,
    fleet: FleetView,
    records: Mapping[str, Held],
    facts: Facts,
    *,
    trace: str,
) -> list[Action]:
    held = workload.status.allocations
    bound = workload.status.state in BOUND
    out: list[Action] = []
    if not bound:
        out += _node_writes(workload, records, phase="Pending", trace=trace)
    out += _node_writes(workload, records, phase="Bound", trace=trace)
    template = claim_template(workload, held, fleet.members, traceparent=trace)
    out.append(ApplyTemplate(template=template, step="" if bound else "allocate:template"))
    message = (
        f"{len(held)} x {workload.spec.topology_size}-node on "
        + ", ".join(dict.fromkeys(r.ultra_server for r in held))
        + f"; ResourceClaimTemplate {workload.template_name}"
    )
    out += status_write(
        workload,
        now=facts.now,
        state="Allocated",
        reason="Allocated",
        message=message,
        records=held,
        allocation_time=workload.status.allocation_time or facts.now,
        step="allocate:allocated",
    )
    out.append(Emit(reason="Allocated", message=message))
    return out


def _failed(
    workload: Workload,
    fleet: FleetView,
    records: Mapping[str, Held],
    facts: Facts,
    nodes: Sequence[str],
) -> list[Action]:
    strategy = workload.spec.allocation_policy.failure_strategy
    message = f"nodes not ready: {', '.join(sorted(nodes))} (failureStrategy {strategy})"
    failed = Emit(reason="NodeFailed", message=message, warning=True)
    if strategy == "RestartAll":
        return [
            failed,
            *_unbind(workload, records),
            *status_write(
                workload, now=facts.now, state="Pending", reason="RestartAll", message=message
            ),
            Requeue(after=0.0),
        ]
    out: list[Action] = [failed]
    if strategy in REPLACING:
        if facts.replacement is None:
            return [failed, *_ask_replacement(workload, fleet, set(nodes))]
        if facts.replacement.granted:
            return _replaced(
                workload, fleet, records, facts, answer=facts.replacement, affected=set(nodes)
            )
        # Reported with the question. Asking to replace every unit gave the nodes back first:
        # the workload takes them again, so that they stay its own while it reports them.
        affected = set(nodes)
        everything = not _kept(workload, affected)
        out = [RequestAllocation(purpose="hold", nodes=workload.nodes)] if everything else []
        message = (
            f"{message}; no replacement: {facts.replacement.reason or 'the allocator refused'}"
        )
    return out + status_write(
        workload,
        now=facts.now,
        state="PartiallyAllocated",
        reason="NodeFailed",
        message=message,
        records=workload.status.allocations,
        allocation_time=workload.status.allocation_time,
    )


def _ask_replacement(workload: Workload, fleet: FleetView, affected: set[str]) -> list[Action]:
    """Keep the units none of whose nodes failed; place the others away from their servers."""
    kept = _kept(workload, affected)
    broken = [r for r in workload.status.allocations if _touches(r, affected)]
    # Away from the failed units' UltraServers (found by node, or by name when the node is
    # gone from the fleet), and from every UltraServer with a member that is not Ready.
    avoid = {fleet.server_ids[n] for n in affected if n in fleet.server_ids}
    avoid |= {fleet.servers[r.ultra_server] for r in broken if r.ultra_server in fleet.servers}
    avoid |= {
        fleet.server_ids[n]
        for n, member in fleet.members.items()
        if not member.healthy and n in fleet.server_ids
    }
    exclude = tuple(sorted(avoid))
    # Every unit failed: nothing to keep, so the workload is placed anew elsewhere.
    out: list[Action] = [] if kept else [Release()]
    out.append(RequestAllocation(purpose="replace", nodes=kept, exclude=exclude))
    return out


def _replaced(
    workload: Workload,
    fleet: FleetView,
    records: Mapping[str, Held],
    facts: Facts,
    *,
    answer: AllocationDecided,
    affected: set[str],
) -> list[Action]:
    held = workload.status.allocations
    new = records_from_grants(answer.grants, names=fleet.names)
    before = [n.node_name for r in held for n in r.nodes]
    given_up = sorted(set(before) - set(answer.nodes))
    gained = [n for n in answer.nodes if n not in before]
    broken = [r for r in held if _touches(r, affected)]
    message = (
        f"replaced {', '.join(given_up)} with {', '.join(gained)} "
        f"(ultraserverIndex {', '.join(str(r.ultraserver_index) for r in broken)})"
    )
    clears = tuple(
        NodeWrite(node=n, record=None) for n in given_up if _held_by(records, n, workload)
    )
    out: list[Action] = [WriteNodeRecords(writes=clears)] if clears else []
    # Recorded before the new nodes are touched: a crash after this resumes from the status.
    out += status_write(
        workload,
        now=facts.now,
        state="Allocating",
        reason="Replacing",
        message=message,
        records=new,
    )
    out.append(Emit(reason="Replaced", message=message, warning=True))
    return out + _bind(_holding(workload, new), fleet, records, facts, trace=facts.traceparent)


def _deleting(workload: Workload, records: Mapping[str, Held], facts: Facts) -> list[Action]:
    if FINALIZER not in workload.metadata.finalizers:
        return []
    held = workload.status.allocations
    out: list[Action] = []
    if facts.claims is None:
        if workload.status.state != "Deallocating":
            out += status_write(
                workload,
                now=facts.now,
                state="Deallocating",
                reason="Deleting",
                message="",
                records=held,
                step="delete:deallocating",
            )
            out.append(
                Emit(
                    reason="Deallocating",
                    message="releasing UltraServers and removing the template",
                )
            )
        out.append(DeleteTemplate(name=workload.template_name, step="delete:template-deleted"))
        out.append(ListClaims())
        return out
    if facts.claims:
        started = workload.metadata.deletion_timestamp or facts.now
        if age_seconds(started, now=facts.now) <= facts.claim_wait_seconds:
            return [Requeue(after=1.0)]
        names = ", ".join(sorted(facts.claims))
        wait = facts.claim_wait_seconds
        message = f"claims still present after {wait:.0f}s: {names}; releasing"
        out.append(Emit(reason="ClaimsRemain", message=message, warning=True))
    out += _unbind(workload, records, deleting=True)
    out += [
        Emit(reason="Released", message="UltraServers released"),
        ForgetEvents(),
        SetFinalizer(present=False),
        TouchUltraServers(names=tuple(dict.fromkeys(r.ultra_server for r in held))),
    ]
    return out


# --- pieces --------------------------------------------------------------------------------


def _node_writes(
    workload: Workload,
    records: Mapping[str, Held],
    *,
    phase: Literal["Pending", "Bound"],
    trace: str,
) -> list[Action]:
    writes = []
    wanted = node_allocations(workload, workload.status.allocations, phase=phase)
    for node, record in wanted.items():
        held = records.get(node)
        if held is not None:
            if phase == "Pending" and held.record == msgspec.structs.replace(record, phase="Bound"):
                continue  # bound before a restart: never step back to Pending
            if held.record == record and (not trace or held.traceparent == trace):
                continue
        writes.append(NodeWrite(node=node, record=record, traceparent=trace))
    # The nodes of one phase are independent: written together. The phases stay in order
    # (every node Pending before any is Bound).
    step = f"allocate:node-{phase.lower()}"
    return [WriteNodeRecords(writes=tuple(writes), step=step)] if writes else []


def _unbind(
    workload: Workload, records: Mapping[str, Held], *, deleting: bool = False
) -> list[Action]:
    clears = tuple(
        NodeWrite(node=n, record=None) for n in workload.nodes if _held_by(records, n, workload)
    )
    out: list[Action] = []
    if clears:
        out.append(WriteNodeRecords(writes=clears, step="delete:node-cleared" if deleting else ""))
    out += [Release(step="delete:released" if deleting else ""), WakeWaiting()]
    return out


def _holding(workload: Workload, records: tuple[AllocationRecord, ...]) -> Workload:
    """``workload`` as it is once its status records ``records`` (state Allocating)."""
    status = msgspec.structs.replace(workload.status, allocations=records, state="Allocating")
    return msgspec.structs.replace(workload, status=status)


def _held_by(records: Mapping[str, Held], node: str, workload: Workload) -> bool:
    held = records.get(node)
    return held is not None and held.record.workload_uid == workload.metadata.uid


def _trace_of(workload: Workload, records: Mapping[str, Held]) -> str:
    """The trace context the allocation was written with (on its first node that has one)."""
    for node in workload.nodes:
        held = records.get(node)
        if held is not None and held.traceparent and _held_by(records, node, workload):
            return held.traceparent
    return ""


def _kept(workload: Workload, affected: set[str]) -> tuple[str, ...]:
    """The nodes of the units none of whose nodes is ``affected``."""
    held = workload.status.allocations
    return tuple(n.node_name for r in held if not _touches(r, affected) for n in r.nodes)


def _touches(record: AllocationRecord, nodes: set[str]) -> bool:
    return any(n.node_name in nodes for n in record.nodes)


def _same_shape(workload: Workload, records: Sequence[AllocationRecord]) -> bool:
    return len(records) == workload.spec.server_count and all(
        len(r.nodes) == workload.spec.topology_size for r in records
    )
