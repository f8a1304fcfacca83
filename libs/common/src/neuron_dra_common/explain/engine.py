"""explain_pod / explain_claim / explain_workload: the scheduler's checks replayed on a
snapshot, node by node, then grouped (pure)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from neuron_dra_common.explain.celenv import DraCel
from neuron_dra_common.explain.model import (
    Claim,
    DeviceClass,
    NodeFacts,
    claim_from,
    class_from,
    node_from,
    pools_from,
)
from neuron_dra_common.explain.nodes import node_reasons, selector_matches
from neuron_dra_common.explain.reasons import ORDER, Code
from neuron_dra_common.explain.result import (
    Explanation,
    Group,
    NodeEntry,
    Reason,
    Summary,
    Target,
    Verdict,
)
from neuron_dra_common.explain.search import Allocated, Plan, PoolIndex, solve
from neuron_dra_common.explain.snapshot import Snapshot
from neuron_dra_common.explain.whynot import why_not
from neuron_dra_common.explain.workload import WorkloadView, check_workload, placement_reason
from neuron_dra_common.gcpause import while_paused

__all__ = [
    "ExplainError",
    "NotDraPod",
    "TargetNotFound",
    "explain_claim",
    "explain_pod",
    "explain_workload",
]

Obj = Mapping[str, Any]

#: The release whose scheduler this port follows.
CHECKED_AGAINST = "1.36"
_EXTENDED = "aws.amazon.com/neuron"
_RESERVED_FOR_MAX = 256

_cel: DraCel | None = None


class ExplainError(ValueError):
    """The target cannot be explained; the message says why, in one line."""


class TargetNotFound(ExplainError):
    pass


class NotDraPod(ExplainError):
    pass


def _shared_cel() -> DraCel:
    # One environment per process: compiling and the per-device memo are what make 1,000
    # nodes fast, and the operator's loop explains many pods.
    global _cel
    if _cel is None:
        _cel = DraCel()
    return _cel


def _find(objs: Sequence[Obj], namespace: str, name: str) -> Obj | None:
    for obj in objs:
        meta = obj.get("metadata") or {}
        if meta.get("name") == name and meta.get("namespace", "") == namespace:
            return obj
    return None


def _features(server_version: str) -> tuple[bool, bool]:
    """(device taints, partitionable devices): on by default from 1.36."""
    match = re.match(r"v?(\d+)\.(\d+)", server_version or "")
    if match is None:
        return True, True
    on = (int(match.group(1)), int(match.group(2))) >= (1, 36)
    return on, on


class _Context:
    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap
        self.cel = _shared_cel()
        self.nodes = [node_from(n) for n in snap.nodes]
        self.pools = PoolIndex(pools_from(snap.slices))
        self.claims = [claim_from(c) for c in snap.claims]
        self.claims_by_key = {c.key: c for c in self.claims}
        self.classes = {c.name: c for c in (class_from(o) for o in snap.classes)}
        self.taints, self.counters = _features(snap.server_version)
        self.allocated = Allocated.of(self.claims)


def _pod_claims(pod: Obj, ctx: _Context) -> tuple[list[Claim], list[Reason]]:
    meta, spec = pod["metadata"], pod.get("spec") or {}
    namespace = meta.get("namespace", "")
    statuses = {
        s.get("name"): s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ()
    }
    claims: list[Claim] = []
    reasons: list[Reason] = []
    for entry in spec.get("resourceClaims") or ():
        name = entry.get("resourceClaimName")
        template = entry.get("resourceClaimTemplateName")
        if not name and template:
            name = statuses.get(entry.get("name"))
            if not name:
                reasons.append(
                    Reason(
                        code=Code.CLAIM_MISSING,
                        message=f"the claim of pod.spec.resourceClaims {entry.get('name')} (template "
                        f"{template}) is not created yet; the scheduler waits for it",
                        claim=entry.get("name", ""),
                    )
                )
                continue
        claim = ctx.claims_by_key.get(f"{namespace}/{name}")
        if claim is None:
            reasons.append(
                Reason(
                    code=Code.CLAIM_MISSING,
                    message=f"ResourceClaim {namespace}/{name} does not exist",
                    claim=f"{namespace}/{name}",
                )
            )
            continue
        claims.append(claim)
        if claim.deleting:
            reasons.append(
                Reason(
                    code=Code.CLAIM_MISSING,
                    message=f"ResourceClaim {claim.key} is being deleted",
                    claim=claim.key,
                )
            )
        if template and meta.get("uid") and meta["uid"] not in claim.owner_uids:
            reasons.append(
                Reason(
                    code=Code.CLAIM_IN_USE,
                    message=f"ResourceClaim {claim.key} was not created for this pod (pod is not owner)",
                    claim=claim.key,
                )
            )
        if (
            claim.is_allocated
            and meta.get("uid") not in claim.reserved_for
            and len(claim.reserved_for) >= _RESERVED_FOR_MAX
        ):
            reasons.append(
                Reason(
                    code=Code.CLAIM_IN_USE,
                    message=f"ResourceClaim {claim.key} is reserved for {_RESERVED_FOR_MAX} pods already",
                    claim=claim.key,
                )
            )
    return claims, reasons


def _plans(claims: Sequence[Claim], ctx: _Context) -> tuple[list[Plan], list[Reason]]:
    plans: list[Plan] = []
    reasons: list[Reason] = []
    pending = [c for c in claims if not c.is_allocated]
    for index, claim in enumerate(pending):
        for request in claim.requests:
            device_class = ctx.classes.get(request.class_name)
            if request.unsupported:
                device_class = device_class or DeviceClass(name=request.class_name, selectors=())
            elif device_class is None:
                reasons.append(
                    Reason(
                        code=Code.CLASS_MISSING,
                        message=f"request {request.name}: device class {request.class_name} does not exist",
                        claim=claim.key,
                        request=request.name,
                    )
                )
                continue
            plans.append(
                Plan(claim_index=index, claim=claim, request=request, device_class=device_class)
            )
    return plans, reasons


def _node_result(
    node: NodeFacts,
    pod_spec: Obj | None,
    claims: Sequence[Claim],
    plans: Sequence[Plan],
    ctx: _Context,
) -> tuple[Verdict, list[Reason], str]:
    """(verdict, reasons, scheduler error) for one node."""
    if pod_spec is not None:
        reasons = node_reasons(node, pod_spec)
        if reasons:
            # The scheduler stops at the first failing filter: DynamicResources never runs here.
            return "does-not-fit", reasons, ""
    for claim in claims:
        selector = claim.allocation_node_selector
        if claim.is_allocated and selector is not None and not selector_matches(node, selector):
            return (
                "does-not-fit",
                [
                    Reason(
                        code=Code.CLAIM_ON_OTHER_NODE,
                        message=f"ResourceClaim {claim.key} is allocated on another node "
                        "(resourceclaim not available on the node)",
                        claim=claim.key,
                    )
                ],
                "",
            )
    if not plans:
        return "fits", [], ""
    pools = ctx.pools.for_node(node)
    answer = solve(ctx.cel, plans, pools, ctx.allocated, taints=ctx.taints, counters=ctx.counters)
    if answer.outcome == "fits":
        if answer.order_dependent:
            return (
                "fits",
                [
                    Reason(
                        code=Code.SCHEDULER_ERROR,
                        message=f"fits, unless the scheduler reaches this error first: {answer.order_dependent}",
                        subject="order-dependent",
                    )
                ],
                "",
            )
        return "fits", [], ""
    if answer.outcome == "scheduler-error":
        return (
            "scheduler-error",
            [
                Reason(
                    code=Code.SCHEDULER_ERROR,
                    message=f"{answer.error}; the scheduler stops at this error and places the pod nowhere "
                    "until the selector or the slice is fixed",
                    subject=_error_subject(answer.error),
                )
            ],
            answer.error,
        )
    if answer.outcome == "unknown":
        return (
            "unknown",
            [
                Reason(
                    code=Code.CANNOT_EVALUATE,
                    message=f"cannot evaluate: {answer.cannot}",
                    subject=answer.cannot,
                )
            ],
            "",
        )
    reasons = why_not(
        ctx.cel, plans, pools, ctx.allocated, taints=ctx.taints, counters=ctx.counters
    )
    return "does-not-fit", reasons, ""


def _error_subject(error: str) -> str:
    # The device name differs per node; the selector and the error's kind do not.
    return re.sub(r"device \S+", "device", error)


def _group(
    per_node: Mapping[str, tuple[Verdict, list[Reason]]],
) -> tuple[list[Group], dict[str, NodeEntry]]:
    by_key: dict[tuple[str, str], list[str]] = {}
    reasons_of: dict[tuple[str, str], list[Reason]] = {}
    for name in sorted(per_node):
        verdict, reasons = per_node[name]
        ordered = sorted(reasons, key=lambda r: ORDER.get(r.code, len(ORDER)))
        signature = ",".join(dict.fromkeys(r.key() for r in ordered))
        key = (verdict, signature)
        by_key.setdefault(key, []).append(name)
        reasons_of.setdefault(key, ordered)
    rank = {"scheduler-error": 0, "does-not-fit": 1, "unknown": 2, "fits": 3}
    keys = sorted(by_key, key=lambda k: (rank[k[0]], -len(by_key[k]), by_key[k][0]))
    groups = [
        Group(verdict=k[0], nodes=by_key[k], signature=k[1], reasons=reasons_of[k])  # type: ignore[arg-type]
        for k in keys
    ]
    nodes = {
        name: NodeEntry(verdict=g.verdict, group=i)
        for i, g in enumerate(groups)
        for name in g.nodes
    }
    return groups, dict(sorted(nodes.items()))


def _claims_view(claims: Sequence[Claim], ctx: _Context) -> list[dict[str, Any]]:
    out = []
    for claim in claims:
        requests = []
        for request in claim.requests:
            device_class = ctx.classes.get(request.class_name)
            selectors = [
                {"source": f"{s.source} #{s.index}", "expression": s.expression}
                for s in (*(device_class.selectors if device_class else ()), *request.selectors)
            ]
            view: dict[str, Any] = {
                "name": request.name,
                "class": request.class_name,
                "mode": request.mode,
            }
            if request.mode == "ExactCount":
                view["count"] = request.count
            if request.admin_access:
                view["adminAccess"] = True
            view["selectors"] = selectors
            requests.append(view)
        out.append(
            {
                "name": claim.name,
                "allocated": claim.is_allocated,
                "requests": requests,
                "constraints": [
                    {"matchAttribute": c.attribute, "requests": list(c.requests)}
                    for c in claim.constraints
                    if c.attribute
                ],
            }
        )
    return out


def _scheduler_view(pod: Obj | None) -> dict[str, str]:
    for condition in ((pod or {}).get("status") or {}).get("conditions") or ():
        if condition.get("type") == "PodScheduled":
            return {
                "podScheduled": condition.get("status", ""),
                "reason": condition.get("reason", ""),
                "message": condition.get("message", ""),
            }
    return {}


def _explain(
    ctx: _Context,
    *,
    target: Target,
    pod: Obj | None,
    claims: list[Claim],
    pod_level: list[Reason],
) -> Explanation:
    plans, class_reasons = _plans(claims, ctx)
    pod_level = pod_level + class_reasons
    per_node: dict[str, tuple[Verdict, list[Reason]]] = {}
    first_error = ""
    if not pod_level:
        pod_spec = (pod.get("spec") or {}) if pod is not None else None
        for node in ctx.nodes:
            verdict, reasons, error = _node_result(node, pod_spec, claims, plans, ctx)
            per_node[node.name] = (verdict, reasons)
            first_error = first_error or error
    groups, nodes = _group(per_node)
    counts = {
        v: sum(1 for e in nodes.values() if e.verdict == v)
        for v in ("fits", "does-not-fit", "unknown", "scheduler-error")
    }
    blocked_by: Reason | None = None
    if pod_level:
        blocked_by = sorted(pod_level, key=lambda r: ORDER.get(r.code, len(ORDER)))[0]
    elif first_error:
        blocked_by = Reason(code=Code.SCHEDULER_ERROR, message=first_error)
    summary = Summary(
        schedulable=blocked_by is None and counts["fits"] > 0,
        fits=counts["fits"],
        does_not_fit=counts["does-not-fit"],
        scheduler_error=counts["scheduler-error"],
        unknown=counts["unknown"],
        blocked_by=blocked_by,
        scheduler=_scheduler_view(pod),
    )
    return Explanation(
        target=target,
        summary=summary,
        pod_level=pod_level,
        claims=_claims_view(claims, ctx),
        groups=groups,
        nodes=nodes,
        observed=_observed(ctx),
    )


def _observed(ctx: _Context) -> dict[str, Any]:
    observed: dict[str, Any] = {
        "checkedAgainst": f"kube-scheduler {CHECKED_AGAINST}",
        "features": {"deviceTaints": ctx.taints, "partitionableDevices": ctx.counters},
    }
    if ctx.snap.server_version:
        observed["kubernetes"] = ctx.snap.server_version
        if not re.match(rf"v?{re.escape(CHECKED_AGAINST)}\.", ctx.snap.server_version):
            observed["warning"] = (
                f"the cluster runs Kubernetes {ctx.snap.server_version}; explain follows "
                f"kube-scheduler {CHECKED_AGAINST}, whose allocator may differ"
                + (
                    ""
                    if ctx.taints
                    else " (device taints and shared counters not checked: off before 1.36)"
                )
            )
    if ctx.snap.resource_versions:
        observed["resourceVersions"] = dict(ctx.snap.resource_versions)
    return observed


@while_paused
def explain_pod(snap: Snapshot, namespace: str, name: str) -> Explanation:
    pod = _find(snap.pods, namespace, name)
    if pod is None:
        raise TargetNotFound(f"pod {namespace}/{name} not found")
    spec = pod.get("spec") or {}
    if not spec.get("resourceClaims"):
        wants_extended = any(
            _EXTENDED in ((c.get("resources") or {}).get("limits") or {})
            or _EXTENDED in ((c.get("resources") or {}).get("requests") or {})
            for c in (*(spec.get("containers") or ()), *(spec.get("initContainers") or ()))
        )
        hint = (
            f"; it asks for {_EXTENDED}, which the scheduler extender places (not a DRA claim)"
            if wants_extended
            else ""
        )
        raise NotDraPod(
            f"pod {namespace}/{name} is not a DRA pod: spec.resourceClaims is empty{hint}"
        )
    ctx = _Context(snap)
    claims, pod_level = _pod_claims(pod, ctx)
    return _explain(
        ctx,
        target=Target(kind="Pod", namespace=namespace, name=name),
        pod=pod,
        claims=claims,
        pod_level=pod_level,
    )


@while_paused
def explain_claim(snap: Snapshot, namespace: str, name: str) -> Explanation:
    ctx = _Context(snap)
    claim = ctx.claims_by_key.get(f"{namespace}/{name}")
    if claim is None:
        raise TargetNotFound(f"ResourceClaim {namespace}/{name} not found")
    return _explain(
        ctx,
        target=Target(kind="ResourceClaim", namespace=namespace, name=name),
        pod=None,
        claims=[claim],
        pod_level=[],
    )


@while_paused
def explain_workload(snap: Snapshot, namespace: str, name: str) -> Explanation:
    """The workload's UltraServers (whole and healthy, partial and why, held), and its first
    Pending pod node by node: a node outside the UltraServers it holds is
    ``NotUltraServerOfWorkload``."""
    workload = _find(snap.workloads, namespace, name)
    if workload is None:
        raise TargetNotFound(f"NeuronUltraServerWorkload {namespace}/{name} not found")
    template = (workload.get("status") or {}).get("resourceClaimTemplate", "")
    pending = sorted(
        (
            p
            for p in snap.pods
            if (p.get("metadata") or {}).get("namespace") == namespace
            and not (p.get("spec") or {}).get("nodeName")
            and template
            and any(
                c.get("resourceClaimTemplateName") == template
                for c in (p.get("spec") or {}).get("resourceClaims") or ()
            )
        ),
        key=lambda p: p["metadata"]["name"],
    )
    ctx = _Context(snap)
    view = check_workload(
        workload,
        ultraservers=snap.ultraservers,
        nodes=snap.nodes,
        pools=[p for ps in ctx.pools.by_node.values() for p in ps],
        claims=snap.claims,
        tolerations=((pending[0].get("spec") or {}).get("tolerations") or ()) if pending else (),
        pending_pods=[p["metadata"]["name"] for p in pending],
    )
    target = Target(kind="NeuronUltraServerWorkload", namespace=namespace, name=name)
    if not pending:
        blocked = placement_reason(view)
        return Explanation(
            target=target,
            summary=Summary(schedulable=blocked is None, blocked_by=blocked),
            observed=_observed(ctx),
            workload=msgspec.to_builtins(view),
        )
    exp = explain_pod(snap, namespace, pending[0]["metadata"]["name"])
    exp = _outside_held(exp, view)
    return msgspec.structs.replace(exp, target=target, workload=msgspec.to_builtins(view))


def _outside_held(exp: Explanation, view: WorkloadView) -> Explanation:
    """Mark the nodes outside the UltraServers the workload holds."""
    if not view.holds:
        return exp
    held = {n.node for u in view.ultra_servers if u.state == "held" for n in u.nodes}
    home = {n.node: u.name for u in view.ultra_servers for n in u.nodes}
    holds = ", ".join(view.holds)
    per_node: dict[str, tuple[Verdict, list[Reason]]] = {}
    for node, entry in exp.nodes.items():
        group = exp.groups[entry.group]
        verdict, reasons = group.verdict, list(group.reasons)
        if node not in held:
            where = f"UltraServer {home[node]}" if node in home else "no UltraServer"
            verdict = "does-not-fit" if verdict == "fits" else verdict
            reasons = [
                Reason(
                    code=Code.NOT_ULTRASERVER_OF_WORKLOAD,
                    message=f"the node is in {where}; the workload holds {holds}",
                    subject=holds,
                ),
                *(r for r in reasons if r.code != Code.REQUEST_SELECTOR),
            ]
        per_node[node] = (verdict, reasons)
    groups, nodes = _group(per_node)
    fits = sum(1 for e in nodes.values() if e.verdict == "fits")
    summary = msgspec.structs.replace(
        exp.summary,
        schedulable=exp.summary.blocked_by is None and fits > 0,
        fits=fits,
        does_not_fit=sum(1 for e in nodes.values() if e.verdict == "does-not-fit"),
    )
    return msgspec.structs.replace(exp, summary=summary, groups=groups, nodes=nodes)
