"""What to do next for one NeuronUltraServerWorkload, decided from what is known (no I/O).

A workload goes Pending -> Allocating -> Allocated, and on delete Deallocating -> gone. The
decision lists the writes in an order that makes a crash at any point safe to resume:

1. the allocator grants (idempotent per workload UID, recorded on the bus);
2. the grant is recorded in the workload's status (state Allocating);
3. every node gets its allocation record, first ``Pending``, then, once all have it, ``Bound``
   (the kubelet plugin prepares only ``Bound`` nodes, so no pod starts on half a gang); the
   ``Pending`` round also removes the workload's records from nodes its status no longer
   names (a replaced unit's), so a crash after step 2 still clears them;
4. the ResourceClaimTemplate is applied (one naming other nodes was deleted beside the
   ``Pending`` round), and the pods left on other nodes are deleted beside it; 5. the state
   becomes Allocated.

An Allocated workload is confirmed with the allocator on every pass (same nodes), so its
view converges on what the objects record even after it lost its history. A NotReady or lost
node of an allocated workload applies its ``failureStrategy`` (``NoOp``, ``RestartAll``,
``ReplaceAffected`` alias ``MigrateAffected``: see the README). Deleting a workload (a
finalizer holds it) deletes the template and its pods, waits for their claims to go, removes
the node records, clears ``status.allocations``, releases the nodes, then lets go.

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
    DeletePods,
    DeleteTemplate,
    Emit,
    ForgetEvents,
    ListClaims,
    NodeWrite,
    Recheck,
    Release,
    RequestAllocation,
    Requeue,
    RetireTemplate,
    SetFinalizer,
    Together,
    TouchUltraServers,
    WakeWaiting,
    WriteNodeRecords,
)
from neuron_dra_ultraserver_operator.inputs import Facts, FleetView, Held, Owner, Refusal
from neuron_dra_ultraserver_operator.manifests import claim_template, selectors
from neuron_dra_ultraserver_operator.model import FINALIZER, AllocationRecord, Workload
from neuron_dra_ultraserver_operator.ownership import describe, taken
from neuron_dra_ultraserver_operator.records import node_allocations, records_from_grants
from neuron_dra_ultraserver_operator.statuses import age_seconds, status_write

__all__ = ["BOUND", "CONFLICT_RETRY_SECONDS", "PENDING_RETRY_SECONDS", "REPLACING", "decide"]

PENDING_RETRY_SECONDS = 10.0
#: How soon a workload that gave back nodes another one holds asks again (the owner's
#: confirmation, asked for at once, teaches the allocator first).
CONFLICT_RETRY_SECONDS = 2.0
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
    if facts.refused is not None:
        return tuple(_refused(workload, records, facts, facts.refused))
    if facts.answer is None:
        return tuple(_ask(workload, fleet, records, facts))
    if not workload.status.allocations:
        return tuple(_placed(workload, fleet, records, facts, facts.answer))
    return tuple(_confirmed(workload, fleet, records, facts, facts.answer))


# --- one step each -------------------------------------------------------------------------


def _ask(
    workload: Workload, fleet: FleetView, records: Mapping[str, Held], facts: Facts
) -> list[Action]:
    out: list[Action] = []
    if FINALIZER not in workload.metadata.finalizers:
        out.append(SetFinalizer(present=True))
    held = workload.status.allocations
    lost = taken(workload, workload.nodes, facts.owners)
    if held and lost:
        # Never confirmed: the allocator would take the nodes from their owner for this one.
        return out + _conflict(workload, records, facts, lost, granted=False)
    if held and not _same_shape(workload, held):
        out.append(Emit(reason="Reallocating", message="spec changed: releasing and placing again"))
        out += _unbind(workload, records)
        out += status_write(
            workload, now=facts.now, state="Allocating", reason="SpecChanged", message=""
        )
        return out
    if not held:
        # Never onto an UltraServer with a lost, NotReady or failing member.
        exclude = tuple(sorted(_sick_ultraservers(fleet)))
        out.append(RequestAllocation(purpose="place", exclude=exclude, step="allocate:granted"))
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
    conflicts = taken(workload, answer.nodes, facts.owners)
    if conflicts:
        return _conflict(workload, records, facts, conflicts, granted=True)
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
    if not answer.granted and _owns_all(workload, facts.owners):
        # Kubernetes records these nodes as this workload's: the allocator lost track (a
        # restart without its history, a grant to another it has not given back yet). The
        # workload keeps them, says so, and confirms again.
        message = f"the allocator did not confirm the nodes this workload holds: {answer.reason}"
        return [
            Emit(reason="AllocatorDisagrees", message=message, warning=True),
            Requeue(after=PENDING_RETRY_SECONDS),
        ]
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
    down = _down(workload, fleet)
    if workload.status.state in BOUND and down:
        return _failed(workload, fleet, records, facts, down)
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
    template = claim_template(workload, held, fleet.members, traceparent=trace)
    message = (
        f"{len(held)} x {workload.spec.topology_size}-node on "
        + ", ".join(dict.fromkeys(r.ultra_server for r in held))
        + f"; ResourceClaimTemplate {workload.template_name}"
    )
    if bound:
        out = _node_writes(workload, records, facts, phase="Bound", trace=trace)
        out.append(ApplyTemplate(template=template))
    else:
        # Nodes the status no longer names (a replaced unit's) lose this workload's record
        # in the same round as the new nodes get theirs (other Node objects), and a template
        # that names other nodes goes meanwhile: its claims could only take the old ones.
        named = set(workload.nodes)
        strays = tuple(
            NodeWrite(node=n, record=None)
            for n in sorted(records)
            if n not in named and _held_by(records, n, workload)
        )
        pending = _node_writes(workload, records, facts, phase="Pending", trace=trace, also=strays)
        out = [Together(actions=(*pending, RetireTemplate(template=template)))]
        out += _node_writes(workload, records, facts, phase="Bound", trace=trace)
        # The template names these nodes now: pods of the workload still on other nodes (a
        # replaced unit's) are recreated by their controllers and wait for it (the old one
        # is gone), then land here; so the pods go while it is written.
        down = {n for n in fleet.failed} | {n for n, ok in fleet.ready.items() if not ok}
        pods = DeletePods(
            keep=workload.nodes, force=tuple(sorted(down)), selectors=selectors(template)
        )
        out.append(
            Together(actions=(ApplyTemplate(template=template, step="allocate:template"), pods))
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
    down: Mapping[str, str],
) -> list[Action]:
    strategy = workload.spec.allocation_policy.failure_strategy
    nodes = set(down)
    why = "; ".join(f"{n} {down[n]}" for n in sorted(down))
    message = f"nodes failed: {why} (failureStrategy {strategy})"
    failed = Emit(reason="NodeFailed", message=message, warning=True)
    if strategy == "RestartAll":
        # The template goes with the pods: the pods their controllers recreate wait for the
        # template of the new placement instead of taking claims for the old nodes.
        return [
            failed,
            DeleteTemplate(name=workload.template_name, force=tuple(sorted(nodes))),
            *_unbind(workload, records),
            *status_write(
                workload, now=facts.now, state="Pending", reason="RestartAll", message=message
            ),
            Requeue(after=0.0),
        ]
    out: list[Action] = [failed]
    reason = "NodeFailed"
    if strategy in REPLACING:
        if facts.replacement is None:
            return [failed, *_ask_replacement(workload, fleet, nodes)]
        refused = facts.replacement.reason or "the allocator refused"
        recheck: list[Action] = []
        if facts.replacement.granted:
            bad = _unusable(
                facts.replacement,
                fleet,
                kept=set(_kept(workload, nodes)),
                avoid=_avoided(workload, fleet, nodes),
            )
            elsewhere = taken(workload, facts.replacement.nodes, facts.owners)
            if not bad and not elsewhere:
                return _replaced(
                    workload, fleet, records, facts, answer=facts.replacement, affected=nodes
                )
            if bad:
                refused = f"the allocator offered failed or unhealthy nodes again: {', '.join(bad)}"
            else:
                refused = (
                    f"the allocator offered nodes another workload holds: {describe(elsewhere)}"
                )
                # Their owners confirm what they hold, so the allocator learns it.
                recheck.append(Recheck(keys=tuple(sorted({o.key for o in elsewhere.values()}))))
        # Reported with the question. Asking to replace every unit gave the nodes back first:
        # the workload takes them again, so that they stay its own while it reports them.
        everything = not _kept(workload, nodes)
        out = [RequestAllocation(purpose="hold", nodes=workload.nodes)] if everything else []
        out += recheck
        out.append(Emit(reason="NoReplacement", message=refused, warning=True))
        # Waits for capacity: looks again a while later, and whenever a node comes back.
        out.append(Requeue(after=PENDING_RETRY_SECONDS))
        message = f"{message}; no replacement: {refused}"
        reason = "NoReplacement"
    return out + status_write(
        workload,
        now=facts.now,
        state="PartiallyAllocated",
        reason=reason,
        message=message,
        records=workload.status.allocations,
        allocation_time=workload.status.allocation_time,
    )


def _down(workload: Workload, fleet: FleetView) -> dict[str, str]:
    """The workload's nodes that failed, with why: declared lost, an uncorrectable device,
    NotReady, or gone."""
    out: dict[str, str] = {}
    for node in workload.nodes:
        if node in fleet.failed:
            out[node] = fleet.failed[node]
        elif node not in fleet.ready:
            out[node] = "gone"
        elif not fleet.ready.get(node, False):
            out[node] = "NotReady"
    return out


def _sick_ultraservers(fleet: FleetView) -> set[str]:
    """The allocator's keys (NeuronUltraServer names) of every UltraServer with a member
    that is not Ready, lost, or has a failed device: no placement goes there."""
    out: set[str] = set()
    for node, member in fleet.members.items():
        bad = not member.healthy or node in fleet.failed or not fleet.ready.get(node, False)
        if bad and node in fleet.names:
            out.add(fleet.names[node])
    for node in fleet.failed:
        if node in fleet.names:
            out.add(fleet.names[node])
    return out


def _avoided(workload: Workload, fleet: FleetView, affected: set[str]) -> set[str]:
    """Where a replacement must not go: the failed units' UltraServers (by node, or as the
    workload records them when the node is gone from the fleet) and every sick UltraServer."""
    broken = [r for r in workload.status.allocations if _touches(r, affected)]
    avoid = {fleet.names[n] for n in affected if n in fleet.names}
    avoid |= {r.ultra_server for r in broken} | {r.server_id for r in broken}
    return avoid | _sick_ultraservers(fleet)


def _unusable(
    answer: AllocationDecided, fleet: FleetView, *, kept: set[str], avoid: set[str]
) -> list[str]:
    """The new nodes of ``answer`` a replacement must never take (never trusted blindly:
    taking a failed UltraServer again is the loop that never ends)."""
    out = []
    for node in answer.nodes:
        if node in kept:
            continue
        bad = node in fleet.failed or not fleet.ready.get(node, False)
        if bad or fleet.names.get(node) in avoid:
            out.append(node)
    return out


def _ask_replacement(workload: Workload, fleet: FleetView, affected: set[str]) -> list[Action]:
    """Keep the units none of whose nodes failed; place the others away from their servers."""
    kept = _kept(workload, affected)
    exclude = tuple(sorted(_avoided(workload, fleet, affected)))
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
    broken = [r for r in held if _touches(r, affected)]
    by_index = {r.ultraserver_index: r for r in new}
    parts = []
    for old in broken:
        now = by_index.get(old.ultraserver_index)
        target = now.ultra_server if now is not None else "?"
        gained = ", ".join(n.node_name for n in now.nodes) if now is not None else ""
        parts.append(
            f"UltraServer {old.ultra_server} with {target} (ultraserverIndex "
            f"{old.ultraserver_index}; nodes {', '.join(n.node_name for n in old.nodes)} -> "
            f"{gained})"
        )
    message = "replaced " + "; ".join(parts)
    # Recorded before any node is touched: a crash after this resumes from the status, and
    # the nodes given up lose their records with the first node writes (see ``_bind``).
    out = status_write(
        workload,
        now=facts.now,
        state="Allocating",
        reason="Replacing",
        message=message,
        records=new,
        step="allocate:recorded",
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
    # The records go first, then the status stops naming the nodes, and only then does the
    # allocator get them back: nothing lists a released UltraServer as this workload's once
    # another may be given it. A crash in between resumes with the release.
    clears = _clears(workload, records)
    if clears:
        out.append(WriteNodeRecords(writes=clears, step="delete:node-cleared"))
    if held:
        out += status_write(
            workload,
            now=facts.now,
            state="Deallocating",
            reason="Deleting",
            message="",
            step="delete:cleared",
        )
    out += [
        Release(step="delete:released"),
        WakeWaiting(),
        Emit(reason="Released", message="UltraServers released"),
        ForgetEvents(),
        SetFinalizer(present=False),
        TouchUltraServers(names=tuple(dict.fromkeys(r.ultra_server for r in held))),
    ]
    return out


def _conflict(
    workload: Workload,
    records: Mapping[str, Held],
    facts: Facts,
    conflicts: Mapping[str, Owner],
    *,
    granted: bool,
) -> list[Action]:
    """Give back every node: some are another workload's (``granted``: the allocator just
    offered them; else this workload's status records them). Its owners confirm what they
    hold at once, then this workload asks again."""
    who = describe(conflicts)
    if granted:
        message = f"the allocator offered nodes another workload holds: {who}; asking again"
    else:
        message = f"nodes recorded for this workload are held by another: {who}; placing again"
    owners = tuple(sorted({o.key for o in conflicts.values()}))
    return [
        Emit(reason="AllocationConflict", message=message, warning=True),
        *_unbind(workload, records),
        Recheck(keys=owners),
        *status_write(
            workload, now=facts.now, state="Pending", reason="AllocationConflict", message=message
        ),
        Requeue(after=CONFLICT_RETRY_SECONDS),
    ]


def _refused(
    workload: Workload, records: Mapping[str, Held], facts: Facts, refusal: Refusal
) -> list[Action]:
    """The executor found an object it was to write held by someone else: a node (taken
    between reading the cache and writing) or a ResourceClaimTemplate this workload does not
    own. Nothing of another's is ever overwritten."""
    if refusal.kind == "Node":
        conflicts = {refusal.name: Owner(uid="", key=refusal.holder)}
        return _conflict(workload, records, facts, conflicts, granted=False)
    message = (
        f"{refusal.kind} {workload.metadata.namespace}/{refusal.name} exists and is not this "
        f"workload's ({refusal.holder}): left alone; name another in "
        "spec.resourceClaimTemplate.name, or delete it"
    )
    return [
        Emit(reason="TemplateConflict", message=message, warning=True),
        *status_write(
            workload,
            now=facts.now,
            state="Allocating",
            reason="TemplateConflict",
            message=message,
            records=workload.status.allocations,
            allocation_time=workload.status.allocation_time,
        ),
        Requeue(after=PENDING_RETRY_SECONDS),
    ]


def _owns_all(workload: Workload, owners: Mapping[str, Owner]) -> bool:
    """Whether Kubernetes records every node of the workload as its own."""
    uid = workload.metadata.uid
    return bool(workload.nodes) and all(
        (o := owners.get(n)) is not None and o.uid == uid for n in workload.nodes
    )


# --- pieces --------------------------------------------------------------------------------


def _node_writes(
    workload: Workload,
    records: Mapping[str, Held],
    facts: Facts,
    *,
    phase: Literal["Pending", "Bound"],
    trace: str,
    also: tuple[NodeWrite, ...] = (),
) -> list[Action]:
    """The writes of ``phase`` to the workload's nodes that do not hold it yet, with ``also``
    (writes to other nodes) in the same round."""
    writes = list(also)
    wanted = node_allocations(workload, workload.status.allocations, phase=phase)
    for node, record in wanted.items():
        held = records.get(node)
        over = ""
        if held is not None:
            if phase == "Pending" and held.record == msgspec.structs.replace(record, phase="Bound"):
                continue  # bound before a restart: never step back to Pending
            if held.record == record and (not trace or held.traceparent == trace):
                continue
            uid = held.record.workload_uid
            owner = facts.owners.get(node)
            if uid != workload.metadata.uid and (owner is None or owner.uid != uid):
                # Left by a workload that no longer exists: the only other record a write
                # may replace (the executor checks it is still that one).
                over = uid
        writes.append(NodeWrite(node=node, record=record, traceparent=trace, over=over))
    # The nodes of one phase are independent: written together. The phases stay in order
    # (every node Pending before any is Bound).
    step = f"allocate:node-{phase.lower()}"
    return [WriteNodeRecords(writes=tuple(writes), step=step)] if writes else []


def _unbind(workload: Workload, records: Mapping[str, Held]) -> list[Action]:
    clears = _clears(workload, records)
    out: list[Action] = [WriteNodeRecords(writes=clears)] if clears else []
    return [*out, Release(), WakeWaiting()]


def _clears(workload: Workload, records: Mapping[str, Held]) -> tuple[NodeWrite, ...]:
    """The removals of the workload's records from the nodes that carry them."""
    return tuple(
        NodeWrite(node=n, record=None) for n in workload.nodes if _held_by(records, n, workload)
    )


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
