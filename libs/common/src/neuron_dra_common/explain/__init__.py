"""Why a pod is Pending: the scheduler's DRA checks replayed on a snapshot of the cluster.

Pure: no I/O and no asyncio. The CLI (``neuron-dra explain``) and the UltraServer operator
fetch the objects and call::

    snap = Snapshot.build(pods=[...], nodes=[...], slices=[...], claims=[...], classes=[...])
    exp = explain_pod(snap, namespace="ns", name="p")
    print(render_text(exp))
"""

from __future__ import annotations

from neuron_dra_common.explain.result import (
    Explanation,
    Group,
    NodeEntry,
    Reason,
    Summary,
    Target,
    Verdict,
)
from neuron_dra_common.explain.snapshot import Snapshot

__all__ = [
    "Explanation",
    "Group",
    "NodeEntry",
    "Reason",
    "Snapshot",
    "Summary",
    "Target",
    "Verdict",
    "explain_claim",
    "explain_pod",
    "explain_workload",
    "render_text",
    "to_json",
]


def explain_pod(snap: Snapshot, namespace: str, name: str) -> Explanation:
    """Why pod ``namespace/name`` is (not) schedulable, node by node."""
    raise NotImplementedError


def explain_claim(snap: Snapshot, namespace: str, name: str) -> Explanation:
    """Where ResourceClaim ``namespace/name`` could be allocated, node by node."""
    raise NotImplementedError


def explain_workload(snap: Snapshot, namespace: str, name: str) -> Explanation:
    """Why the pods of NeuronUltraServerWorkload ``namespace/name`` do (not) fit."""
    raise NotImplementedError


def render_text(exp: Explanation) -> str:
    """The explanation for a person: a summary line, then one block per node group."""
    raise NotImplementedError


def to_json(exp: Explanation) -> bytes:
    """The explanation as JSON, schema ``explain.neuron.aws.com/v1``."""
    raise NotImplementedError
