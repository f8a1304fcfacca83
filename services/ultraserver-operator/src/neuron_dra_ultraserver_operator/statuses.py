"""The NeuronUltraServerWorkload status the operator writes, and timestamps (no I/O)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec

from neuron_dra_ultraserver_operator.actions import Action, WriteStatus
from neuron_dra_ultraserver_operator.model import AllocationRecord, Workload
from neuron_dra_ultraserver_operator.records import topo0_host

__all__ = ["age_seconds", "stamp", "status_body", "unchanged"]

Obj = dict[str, Any]
_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def stamp(when: datetime | None = None) -> str:
    """An API timestamp (``2026-01-31T12:00:00Z``) of ``when``, by default now."""
    return (when or datetime.now(UTC)).strftime(_FORMAT)


def age_seconds(since: str, *, now: str) -> float:
    """Seconds from ``since`` to ``now`` (API timestamps); 0 when either is unreadable."""
    try:
        then = datetime.strptime(since, _FORMAT).replace(tzinfo=UTC)
        current = datetime.strptime(now, _FORMAT).replace(tzinfo=UTC)
    except ValueError:
        return 0.0
    return (current - then).total_seconds()


def status_body(
    workload: Workload,
    *,
    state: str,
    reason: str,
    message: str,
    now: str,
    records: Sequence[AllocationRecord] = (),
    allocation_time: str = "",
) -> Obj:
    """The whole status of ``workload`` in ``state`` holding ``records``."""
    allocated = state in ("Allocated", "PartiallyAllocated")
    generation = workload.metadata.generation
    status: Obj = {
        "state": state,
        "reason": reason,
        "message": message,
        "workloadId": workload.metadata.name,
        "allocatedUltraServers": list(dict.fromkeys(r.ultra_server for r in records)),
        "totalNodesAllocated": sum(len(r.nodes) for r in records),
        "allocations": [msgspec.to_builtins(r) for r in records],
        "observedGeneration": generation,
        "conditions": [
            _condition(workload, kind, value, reason=reason, message=message, now=now)
            for kind, value in (
                ("Allocated", allocated),
                # Ready: every unit on healthy nodes (``kubectl wait --for=condition=Ready``).
                ("Ready", state == "Allocated"),
                # Degraded: a failure is being handled or waits for capacity.
                ("Degraded", state == "PartiallyAllocated" or reason in _DEGRADED),
            )
        ],
    }
    if records:
        status["topology0Host"] = topo0_host(records)
    if allocated:
        status["resourceClaimTemplate"] = workload.template_name
    if allocation_time:
        status["allocationTime"] = allocation_time
    return status


def unchanged(workload: Workload, status: Obj) -> bool:
    """Whether the workload shows ``status`` already (its conditions' times aside)."""
    return _plain(workload.reported) == _plain(status)


def _plain(status: Obj) -> Obj:
    return {k: v for k, v in status.items() if k != "conditions"}


#: The reasons of a workload that is recovering from a failure.
_DEGRADED = ("NodeFailed", "NoReplacement", "RestartAll", "Replacing")


def _condition(
    workload: Workload, kind: str, value: bool, *, reason: str, message: str, now: str
) -> Obj:
    return {
        "type": kind,
        "status": "True" if value else "False",
        "reason": reason or kind,
        "message": message[:1024],
        "lastTransitionTime": _since(workload, kind, value, now=now),
        "observedGeneration": workload.metadata.generation,
    }


def _since(workload: Workload, kind: str, value: bool, *, now: str) -> str:
    for cond in workload.reported.get("conditions") or ():
        if cond.get("type") == kind and (cond.get("status") == "True") == value:
            return str(cond.get("lastTransitionTime") or now)
    return now


def status_write(
    workload: Workload,
    *,
    now: str,
    state: str,
    reason: str,
    message: str,
    records: Sequence[AllocationRecord] = (),
    allocation_time: str = "",
    step: str = "",
) -> list[Action]:
    """The write of that status, unless the workload shows it already; the
    NeuronUltraServers it held and holds are touched."""
    status = status_body(
        workload,
        state=state,
        reason=reason,
        message=message,
        now=now,
        records=records,
        allocation_time=allocation_time,
    )
    if unchanged(workload, status):
        return []
    touch = [r.ultra_server for r in workload.status.allocations]
    touch += [r.ultra_server for r in records]
    return [WriteStatus(status=status, touch=tuple(dict.fromkeys(touch)), step=step)]
