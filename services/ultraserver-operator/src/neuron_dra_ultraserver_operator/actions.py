"""What the decider asks for, as values: the executor performs them in order (no I/O here).

Each action concerns the workload it was decided for. ``step`` names the crash point that
fires right after the action took effect (see ``faults``); empty for none. A query (an
allocator request, the listing of claims) is always the last action of a decision: what it
learns is a fact of the next decision of the same pass (see :func:`asks`).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from neuron_dra_common.ultraserver import NodeAllocation

__all__ = [
    "Action",
    "ApplyTemplate",
    "DeletePods",
    "DeleteTemplate",
    "Emit",
    "ForgetEvents",
    "ListClaims",
    "NodeWrite",
    "Recheck",
    "Release",
    "RequestAllocation",
    "Requeue",
    "RetireTemplate",
    "SetFinalizer",
    "Together",
    "TouchUltraServers",
    "WakeWaiting",
    "WriteNodeRecords",
    "WriteStatus",
    "asks",
]

Obj = dict[str, Any]
#: What an allocator request is for: a first placement, the confirmation of what the workload
#: holds, the replacement of its failed units (each a query), or taking back nodes it gave
#: back (not a query: the answer shows at the next confirmation).
Purpose = Literal["place", "confirm", "replace", "hold"]


class _Action(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    step: str = ""


class SetFinalizer(_Action, frozen=True, kw_only=True):
    present: bool


class RequestAllocation(_Action, frozen=True, kw_only=True):
    """Ask the allocator (query): ``nodes`` to keep, ``exclude`` UltraServers to avoid."""

    purpose: Purpose
    nodes: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    @property
    def query(self) -> bool:
        return self.purpose != "hold"


class Release(_Action, frozen=True, kw_only=True):
    """Give every node of the workload back to the allocator."""


class WriteStatus(_Action, frozen=True, kw_only=True):
    """Apply ``status``; the NeuronUltraServers in ``touch`` show it in theirs."""

    status: Obj
    touch: tuple[str, ...] = ()


class NodeWrite(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    #: ``None``: remove the record (and its trace context) from the node
    record: NodeAllocation | None
    #: the trace context to write beside the record; empty: leave it as it is
    traceparent: str = ""
    #: the UID of a workload that no longer exists whose record this write may replace (any
    #: other workload's record is never written over)
    over: str = ""


class WriteNodeRecords(_Action, frozen=True, kw_only=True):
    """Write independent node records together (``step`` fires after each)."""

    writes: tuple[NodeWrite, ...]


class ApplyTemplate(_Action, frozen=True, kw_only=True):
    template: Obj


class RetireTemplate(_Action, frozen=True, kw_only=True):
    """Delete the workload's template if its claims would take other nodes than
    ``template``'s (a replacement: its spec is immutable, so the new one is created anew).
    Pods created until the new one exists wait for it instead of taking the old nodes."""

    template: Obj


class DeleteTemplate(_Action, frozen=True, kw_only=True):
    """Delete the workload's template (if it is the workload's) and the pods using it;
    ``step`` fires only when a template was deleted. Pods on ``force`` nodes (lost: no
    kubelet will confirm) are deleted at once, without a grace period."""

    name: str
    force: tuple[str, ...] = ()


class DeletePods(_Action, frozen=True, kw_only=True):
    """Delete the workload's pods (those using its template) running on a node outside
    ``keep``, so their controllers recreate them where the workload is now; on ``force``
    nodes without a grace period. A pod not scheduled yet goes too when its claims take
    other nodes than ``selectors`` (the CEL selectors of the template it should use)."""

    keep: tuple[str, ...]
    force: tuple[str, ...] = ()
    selectors: tuple[str, ...] = ()


class ListClaims(_Action, frozen=True, kw_only=True):
    """Which claims made for the workload still exist (query)."""


class Emit(_Action, frozen=True, kw_only=True):
    """Record an Event on the workload."""

    reason: str
    message: str
    warning: bool = False


class ForgetEvents(_Action, frozen=True, kw_only=True):
    """The workload is gone: drop what was remembered of its Events."""


class Requeue(_Action, frozen=True, kw_only=True):
    after: float


class Recheck(_Action, frozen=True, kw_only=True):
    """Reconcile other workloads now (by ``namespace/name``): the owners of nodes the
    allocator handed out again, so that their confirmation teaches it who holds them."""

    keys: tuple[str, ...]


class WakeWaiting(_Action, frozen=True, kw_only=True):
    """Capacity came back: every waiting workload gets another look."""


class TouchUltraServers(_Action, frozen=True, kw_only=True):
    names: tuple[str, ...]


class Together(_Action, frozen=True, kw_only=True):
    """Writes independent of each other, performed at once (never a query, nor an Event);
    each one's ``step`` fires after it. The next action starts when all are done."""

    actions: tuple[Action, ...]


Action = (
    SetFinalizer
    | RequestAllocation
    | Release
    | WriteStatus
    | WriteNodeRecords
    | ApplyTemplate
    | RetireTemplate
    | DeleteTemplate
    | DeletePods
    | ListClaims
    | Emit
    | ForgetEvents
    | Requeue
    | WakeWaiting
    | Recheck
    | TouchUltraServers
    | Together
)


def asks(actions: tuple[Action, ...]) -> bool:
    """Whether the decision ends with a query, whose answer the next decision needs."""
    last = actions[-1] if actions else None
    return isinstance(last, ListClaims) or (isinstance(last, RequestAllocation) and last.query)
