"""What must hold however the stack is churned and killed (no I/O: the objects come in).

* **No device held twice**: no device is in the allocation of two ResourceClaims; a claim on
  a node's whole-node device (``neuronnode``) holds every device of that node's pool.
* **No UltraServer node held twice**: no node is in the allocations of two
  NeuronUltraServerWorkloads.
* **The audit reconciles** (once the stack converged): no event is written twice, and the
  claims the audit shows prepared (a ``ClaimPrepared`` not followed by a ``ClaimUnprepared``
  on the same node) are exactly the claims of the pods running now, on their nodes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from neuron_dra_common.driver import DRIVER_NAME, NODE_DEVICE

__all__ = ["audit_mismatches", "devices_held_twice", "nodes_held_twice", "running_claims"]

PREPARED = "claim.prepared.v1"
UNPREPARED = "claim.unprepared.v1"

Obj = dict[str, Any]


def _name(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}".lstrip("/")


def devices_held_twice(claims: Iterable[Obj]) -> list[str]:
    """Each device (or whole node) of ours allocated to more than one claim, in words.

    Claims ``default/a`` and ``default/b`` both allocated device ``neurondevice0`` of pool
    ``n1`` give ``['n1/neurondevice0 held by default/a and default/b']``.
    """
    holders: dict[tuple[str, str], set[str]] = defaultdict(set)
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or ():
            if result.get("driver") != DRIVER_NAME:
                continue
            holders[(str(result.get("pool")), str(result.get("device")))].add(_name(claim))
    problems = [
        f"{pool}/{device} held by {' and '.join(sorted(names))}"
        for (pool, device), names in sorted(holders.items())
        if len(names) > 1
    ]
    for (pool, device), whole in sorted(holders.items()):
        if device != NODE_DEVICE:
            continue
        others = {
            name
            for (p, d), names in holders.items()
            if p == pool and d != NODE_DEVICE
            for name in names
        } - whole
        if others:
            problems.append(
                f"{pool} held whole by {' and '.join(sorted(whole))} and in part by "
                f"{' and '.join(sorted(others))}"
            )
    return problems


def nodes_held_twice(workloads: Iterable[Obj]) -> list[str]:
    """Each UltraServer node in the allocations of more than one workload, in words.

    Workloads ``default/a`` on node ``n1`` and ``default/b`` on ``n1`` and ``n2`` give
    ``['node n1 held by default/a and default/b']``.
    """
    holders: dict[str, set[str]] = defaultdict(set)
    for workload in workloads:
        for allocation in (workload.get("status") or {}).get("allocations") or ():
            for node in allocation.get("nodes") or ():
                holders[str(node.get("nodeName"))].add(_name(workload))
    return [
        f"node {node} held by {' and '.join(sorted(names))}"
        for node, names in sorted(holders.items())
        if len(names) > 1
    ]


def running_claims(pods: Iterable[Obj], claims: Iterable[Obj]) -> dict[tuple[str, str], str]:
    """(node, claim UID) -> the claim's ``namespace/name``, for every claim of a pod that runs
    (phase Running and not being deleted); ``pods`` and ``claims`` of one namespace."""
    uids = {c["metadata"]["name"]: c["metadata"]["uid"] for c in claims}
    running: dict[tuple[str, str], str] = {}
    for pod in pods:
        status = pod.get("status") or {}
        if status.get("phase") != "Running" or pod["metadata"].get("deletionTimestamp"):
            continue
        for ref in status.get("resourceClaimStatuses") or ():
            name = ref.get("resourceClaimName")
            if name in uids:
                namespace = pod["metadata"].get("namespace", "")
                running[(pod["spec"]["nodeName"], uids[name])] = f"{namespace}/{name}"
    return running


def audit_mismatches(
    lines: Iterable[Obj], running: Mapping[tuple[str, str], str], *, namespace: str
) -> list[str]:
    """How the audit (its CloudEvents, in the order written) differs from the claims prepared
    now, in words. ``running`` maps (node, claim UID) to the claim's ``namespace/name`` for
    every running pod's claim in ``namespace``; only claims of ``namespace`` are compared.

    A pod ``chaos/p1`` running on ``n1`` with claim UID ``u1`` and an audit holding only
    ``ClaimPrepared`` of ``u1`` on ``n1`` give ``[]``; without that event, ``['claim chaos/p1-c
    (u1) runs on n1 but the audit never showed it prepared there']``.
    """
    problems: list[str] = []
    seen: set[str] = set()
    prepared: dict[tuple[str, str], str] = {}
    for line in lines:
        ident = str(line.get("id", ""))
        if ident in seen:
            problems.append(f"event {ident} written twice")
        seen.add(ident)
        data = line.get("data") or {}
        kind = data.get("type")
        claim = data.get("claim") or {}
        if kind not in (PREPARED, UNPREPARED) or claim.get("namespace") != namespace:
            continue
        key = (str(data.get("node")), str(claim.get("uid")))
        if kind == PREPARED:
            prepared[key] = f"{claim.get('namespace')}/{claim.get('name')}"
        else:
            prepared.pop(key, None)
    for (node, uid), name in sorted(running.items()):
        if (node, uid) not in prepared:
            problems.append(
                f"claim {name} ({uid}) runs on {node} but the audit never showed it prepared there"
            )
    for (node, uid), name in sorted(prepared.items()):
        if (node, uid) not in running:
            problems.append(
                f"claim {name} ({uid}) is prepared on {node} by the audit, but no pod of it runs"
            )
    return problems
