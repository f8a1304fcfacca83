"""Why a pod is Pending: the scheduler's DRA checks replayed on a snapshot of the cluster.

Pure: no I/O and no asyncio. The CLI (``neuron-dra explain``) and the UltraServer operator
fetch the objects and call::

    snap = Snapshot.build(pods=[...], nodes=[...], slices=[...], claims=[...], classes=[...])
    exp = explain_pod(snap, namespace="ns", name="p")
    print(render_text(exp))
"""

from __future__ import annotations

from neuron_dra_common.explain.engine import (
    ExplainError,
    NotDraPod,
    TargetNotFound,
    explain_claim,
    explain_pod,
    explain_workload,
)
from neuron_dra_common.explain.render import render_text, to_json
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
    "ExplainError",
    "Explanation",
    "Group",
    "NodeEntry",
    "NotDraPod",
    "Reason",
    "Snapshot",
    "Summary",
    "Target",
    "TargetNotFound",
    "Verdict",
    "explain_claim",
    "explain_pod",
    "explain_workload",
    "render_text",
    "to_json",
]
