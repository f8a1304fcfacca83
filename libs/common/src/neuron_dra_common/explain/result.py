"""What explain answers: per node a verdict, nodes grouped by the same reasons, and a summary.

These Structs are the ``-o json`` schema (``explain.neuron.aws.com/v1``) and the contract with
the operator's Pending-pod loop (``event_message``, ``signature``, ``top_code``).
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

import msgspec

__all__ = [
    "API_VERSION",
    "Explanation",
    "Group",
    "NodeEntry",
    "Reason",
    "Summary",
    "Target",
    "Verdict",
]

API_VERSION = "explain.neuron.aws.com/v1"

Verdict = Literal["fits", "does-not-fit", "unknown", "scheduler-error"]


class Reason(msgspec.Struct, frozen=True, rename="camel", omit_defaults=True):
    """One reason a node (or the pod as a whole) does not fit.

    ``code`` is a stable string (see ``reasons.Code``); ``subject`` names what the reason is
    about (a selector, a taint, an attribute) so that two nodes share a group only when their
    reasons are about the same things. ``details`` carries counts and device names for the
    JSON output; they never take part in the signature.
    """

    code: str
    message: str
    claim: str = ""
    request: str = ""
    subject: str = ""
    details: dict[str, Any] = {}

    def key(self) -> str:
        return "|".join((self.code, self.claim, self.request, self.subject))


class NodeEntry(msgspec.Struct, frozen=True, rename="camel"):
    verdict: Verdict
    group: int


class Group(msgspec.Struct, frozen=True, rename="camel"):
    verdict: Verdict
    nodes: list[str]
    signature: str
    reasons: list[Reason]


class Target(msgspec.Struct, frozen=True, rename="camel"):
    kind: str
    namespace: str
    name: str


class Summary(msgspec.Struct, frozen=True, rename="camel"):
    schedulable: bool
    fits: int = 0
    does_not_fit: int = 0
    scheduler_error: int = 0
    unknown: int = 0
    blocked_by: Reason | None = None
    scheduler: dict[str, str] = {}


class Explanation(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The answer for one pod, claim or workload. ``to_json`` writes it as schema v1."""

    api_version: str = API_VERSION
    kind: str = "Explanation"
    target: Target
    summary: Summary
    pod_level: list[Reason] = []
    claims: list[dict[str, Any]] = []
    groups: list[Group] = []
    nodes: dict[str, NodeEntry] = {}
    observed: dict[str, Any] = {}
    workload: dict[str, Any] | None = None

    def reasons(self) -> list[Reason]:
        """Pod-level reasons first, then each not-fitting group's, in group order."""
        out = list(self.pod_level)
        for group in self.groups:
            if group.verdict != "fits":
                out.extend(group.reasons)
        return out

    def signature(self) -> str:
        """A short stable digest of the set of reasons (codes and subjects, not counts): it
        changes exactly when what blocks the pod changes."""
        keys = sorted({reason.key() for reason in self.reasons()})
        if self.summary.schedulable:
            keys = ["schedulable"]
        return hashlib.sha256("\n".join(keys).encode()).hexdigest()[:16]

    def top_code(self) -> str:
        """The reason code that matters most ("" when the pod fits somewhere)."""
        if self.summary.schedulable:
            return ""
        if self.summary.blocked_by is not None:
            return self.summary.blocked_by.code
        reasons = self.reasons()
        return reasons[0].code if reasons else ""

    def event_message(self) -> str:
        """One paragraph of at most 1 KiB starting with the top reason code, for an Event."""
        from neuron_dra_common.explain.render import event_message

        return event_message(self)
