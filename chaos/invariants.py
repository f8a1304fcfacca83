"""What must hold however the stack is churned and killed (no I/O: the objects come in).

* **No device held twice**: no device is in the allocation of two ResourceClaims; a claim on
  a node's whole-node device (``neuronnode``) holds every device of that node's pool.
* **No UltraServer node held twice**: no node is in the allocations of two
  NeuronUltraServerWorkloads.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from neuron_dra_common.driver import DRIVER_NAME, NODE_DEVICE

__all__ = ["devices_held_twice", "nodes_held_twice"]

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
