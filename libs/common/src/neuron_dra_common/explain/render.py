"""An explanation as text for a person, as JSON (schema v1), or as one Event paragraph (pure)."""

from __future__ import annotations

from typing import Any

import msgspec

from neuron_dra_common.explain.result import Explanation, Group

__all__ = ["event_message", "render_text", "to_json"]

_EVENT_LIMIT = 1024
_VERDICT_TEXT = {
    "fits": "fits",
    "does-not-fit": "does not fit",
    "unknown": "cannot tell",
    "scheduler-error": "scheduler error",
}


def _node_list(nodes: list[str], limit: int = 3) -> str:
    if len(nodes) <= limit:
        return ", ".join(nodes)
    return f"{', '.join(nodes[:limit])} and {len(nodes) - limit} more"


def _headline(exp: Explanation) -> str:
    target = f"{exp.target.kind} {exp.target.namespace}/{exp.target.name}"
    s = exp.summary
    total = s.fits + s.does_not_fit + s.unknown + s.scheduler_error
    if s.blocked_by is not None:
        return f"{target}: will not be scheduled: {s.blocked_by.code}: {s.blocked_by.message}"
    if exp.workload is not None and not exp.nodes:
        if exp.workload.get("holds"):
            return f"{target}: holds {', '.join(exp.workload['holds'])}; no pod waits"
        return f"{target}: enough free UltraServers; the operator can place it"
    if s.schedulable:
        return f"{target}: fits {s.fits} of {total} nodes"
    if s.unknown:
        return f"{target}: no node fits for sure; {s.unknown} of {total} nodes cannot be evaluated"
    return f"{target}: no node fits (0 of {total} nodes)"


def render_text(exp: Explanation) -> str:
    """A summary line, the scheduler's own condition, the claims, then one block per group."""
    lines = [_headline(exp)]
    scheduler = exp.summary.scheduler
    if scheduler:
        lines.append(
            f"  scheduler says: PodScheduled={scheduler.get('podScheduled')} "
            f"{scheduler.get('reason', '')}: {scheduler.get('message', '')}".rstrip(": ")
        )
    for reason in exp.pod_level:
        lines.append(f"  {reason.code}: {reason.message}")
    for claim in exp.claims:
        state = "allocated" if claim["allocated"] else "to allocate"
        lines.append(f"claim {claim['name']} ({state}):")
        for request in claim["requests"]:
            count = request.get("count", "all")
            admin = ", adminAccess" if request.get("adminAccess") else ""
            lines.append(
                f"  request {request['name']}: {count} from class {request['class']}{admin}"
            )
            for selector in request["selectors"]:
                lines.append(f"    {selector['source']}: {selector['expression']}")
        for constraint in claim["constraints"]:
            lines.append(
                f"  matchAttribute {constraint['matchAttribute']} over "
                f"{', '.join(constraint['requests']) or 'all requests'}"
            )
    for group in exp.groups:
        lines.append(_group_head(group))
        for reason in group.reasons:
            lines.append(f"    {reason.code}: {reason.message}")
    if exp.workload:
        lines.extend(_workload_lines(exp.workload))
    if exp.observed.get("warning"):
        lines.append(f"warning: {exp.observed['warning']}")
    checked = exp.observed.get("checkedAgainst")
    if checked:
        lines.append(
            f"(checked against {checked}; other filters such as CPU and memory are not evaluated)"
        )
    return "\n".join(lines) + "\n"


def _workload_lines(view: dict[str, Any]) -> list[str]:
    """``UltraServer us0: whole and healthy`` / ``partial: node-2 NodeUnschedulable: ...``."""
    holds = ", ".join(view.get("holds") or ()) or "none"
    lines = [
        f"workload: {view.get('serverCount')} x {view.get('topologySize')}-node "
        f"{view.get('instanceType')}; holds {holds}; free units: {view.get('usableUnits')} "
        f"(whole and healthy UltraServers: {view.get('whole')})"
    ]
    for us in view.get("ultraServers") or ():
        bad = [n for n in us["nodes"] if not n["ok"]]
        state = {"whole": "whole and healthy", "held": "held by this workload"}.get(
            us["state"],
            f"partial ({len(us['nodes']) - len(bad)} of {len(us['nodes'])} nodes usable)",
        )
        lines.append(f"  UltraServer {us['name']}: {state}")
        for node in bad:
            lines.append(
                f"    {node['node']} (node {node['nodeId']}): {node['code']}: {node['reason']}"
            )
    if view.get("pendingPods"):
        lines.append(f"  pending pods: {', '.join(view['pendingPods'])}")
    return lines


def _group_head(group: Group) -> str:
    count = len(group.nodes)
    noun = "node" if count == 1 else "nodes"
    return f"{_VERDICT_TEXT[group.verdict]}: {count} {noun} ({_node_list(group.nodes)})"


def to_json(exp: Explanation) -> bytes:
    """Schema ``explain.neuron.aws.com/v1``: a Reason's ``details`` sit beside its code."""
    data = msgspec.to_builtins(exp)
    for group in data.get("groups", ()):
        group["reasons"] = [_flat(r) for r in group["reasons"]]
    data["podLevel"] = [_flat(r) for r in data.get("podLevel", ())]
    if data["summary"].get("blockedBy"):
        data["summary"]["blockedBy"] = _flat(data["summary"]["blockedBy"])
    else:
        data["summary"]["blockedBy"] = None
    data.setdefault("workload", None)
    return msgspec.json.encode(data)


def _flat(reason: dict[str, object]) -> dict[str, object]:
    details = reason.pop("details", None)
    if isinstance(details, dict):
        for key, value in details.items():
            reason.setdefault(key, value)
    return reason


def event_message(exp: Explanation) -> str:
    """``<TopCode>: node a: reason; 3 nodes (b, c, d): reason ...``, at most 1 KiB."""
    code = exp.top_code()
    if not code:
        return "schedulable"
    parts: list[str] = []
    if exp.summary.blocked_by is not None:
        parts.append(exp.summary.blocked_by.message)
    for group in exp.groups:
        if group.verdict == "fits" or not group.reasons:
            continue
        count = len(group.nodes)
        where = group.nodes[0] if count == 1 else f"{count} nodes ({_node_list(group.nodes, 2)})"
        parts.append(f"{where}: " + "; ".join(r.message for r in group.reasons))
    text = f"{code}: " + ". ".join(parts)
    encoded = text.encode()
    if len(encoded) <= _EVENT_LIMIT:
        return text
    return encoded[: _EVENT_LIMIT - 3].decode(errors="ignore") + "..."
