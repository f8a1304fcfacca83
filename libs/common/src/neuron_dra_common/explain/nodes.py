"""The node filters kube-scheduler runs before DynamicResources (pure): NodeUnschedulable,
NodeAffinity (``nodeSelector`` and required node affinity) and TaintToleration, plus the
node selectors of slices and allocated claims, which use the same matching."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from neuron_dra_common.explain.model import NodeFacts
from neuron_dra_common.explain.result import Reason

__all__ = ["node_reasons", "selector_matches", "tolerates"]

Obj = Mapping[str, Any]

_NOT_READY = "node.kubernetes.io/not-ready"
_UNREACHABLE = "node.kubernetes.io/unreachable"
_UNSCHEDULABLE = "node.kubernetes.io/unschedulable"


def tolerates(tolerations: Iterable[Obj], taint: Obj) -> bool:
    """Does any toleration match ``taint`` (node taints and device taints match alike)."""
    for toleration in tolerations:
        effect = toleration.get("effect") or ""
        if effect and effect != taint.get("effect"):
            continue
        key = toleration.get("key") or ""
        operator = toleration.get("operator") or "Equal"
        if operator == "Exists":
            if not key or key == taint.get("key"):
                return True
        elif key == taint.get("key") and (toleration.get("value") or "") == (
            taint.get("value") or ""
        ):
            return True
    return False


def _requirement(node: NodeFacts, req: Obj, *, field: bool) -> bool:
    key, operator = req.get("key", ""), req.get("operator", "")
    values: Sequence[str] = req.get("values") or ()
    present: bool
    value: str
    if field:
        present, value = key == "metadata.name", node.name
    else:
        present, value = key in node.labels, node.labels.get(key, "")
    if operator == "In":
        return present and value in values
    if operator == "NotIn":
        return not present or value not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and values:
        try:
            mine, theirs = int(value), int(values[0])
        except ValueError:
            return False
        return mine > theirs if operator == "Gt" else mine < theirs
    return False


def selector_matches(node: NodeFacts, selector: Obj) -> bool:
    """A ``NodeSelector`` (terms ORed, expressions within a term ANDed)."""
    for term in selector.get("nodeSelectorTerms") or ():
        exprs = term.get("matchExpressions") or ()
        fields = term.get("matchFields") or ()
        if not exprs and not fields:
            continue
        if all(_requirement(node, r, field=False) for r in exprs) and all(
            _requirement(node, r, field=True) for r in fields
        ):
            return True
    return False


def node_reasons(node: NodeFacts, pod_spec: Obj) -> list[Reason]:
    """Why the filters before DynamicResources reject ``node`` for the pod (empty: they pass)."""
    reasons: list[Reason] = []
    tolerations = pod_spec.get("tolerations") or ()
    if node.unschedulable and not tolerates(
        tolerations, {"key": _UNSCHEDULABLE, "effect": "NoSchedule"}
    ):
        reasons.append(
            Reason(
                code="NodeUnschedulable", message=f"node {node.name} is cordoned (unschedulable)"
            )
        )
    wanted = pod_spec.get("nodeSelector") or {}
    mismatched = sorted(k for k, v in wanted.items() if node.labels.get(k) != v)
    affinity = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if mismatched:
        detail = ", ".join(
            f"{k}={wanted[k]} (node has {node.labels[k]!r})"
            if k in node.labels
            else f"{k}={wanted[k]} (node has no such label)"
            for k in mismatched
        )
        reasons.append(
            Reason(
                code="NodeSelector",
                message=f"pod's nodeSelector does not match: {detail}",
                subject="nodeSelector " + ",".join(mismatched),
            )
        )
    elif affinity and not selector_matches(node, affinity):
        reasons.append(
            Reason(
                code="NodeSelector",
                message="pod's required node affinity does not match the node's labels",
                subject="nodeAffinity",
            )
        )
    untolerated = [
        t
        for t in node.taints
        if t.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tolerations, t)
    ]
    for taint in untolerated:
        key = taint.get("key", "")
        if key in (_NOT_READY, _UNREACHABLE):
            reasons.append(
                Reason(code="NodeNotReady", message=f"node {node.name} is not ready ({key})")
            )
        elif key == _UNSCHEDULABLE:
            continue  # reported as NodeUnschedulable
        else:
            text = f"{key}={taint['value']}" if taint.get("value") else key
            reasons.append(
                Reason(
                    code="NodeTaint",
                    message=f"node taint {text}:{taint.get('effect')} is not tolerated",
                    subject=f"{key}:{taint.get('effect')}",
                )
            )
    return reasons
