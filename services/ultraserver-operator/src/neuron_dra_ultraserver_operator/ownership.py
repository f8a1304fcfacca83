"""Who holds each node, from what Kubernetes keeps (no I/O).

The allocator's view is rebuilt from a stream and can be lost or stale; what Kubernetes
keeps is not. A node's owner is the workload whose allocation record the Node carries (the
record the kubelet plugin trusts); a node without one belongs to the oldest workload (not
being deleted) whose status records it (it was granted first: a later grant of the same node
is the allocator's mistake). Records of workloads that no longer exist own nothing.

The decider uses it to keep a workload off nodes another one holds, whatever the allocator
answers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from neuron_dra_ultraserver_operator.inputs import Held, Owner
from neuron_dra_ultraserver_operator.model import Workload

__all__ = ["describe", "owners", "taken"]


def owners(workloads: Iterable[Workload], records: Mapping[str, Held]) -> dict[str, Owner]:
    """node name -> the workload that holds it.

    >>> owners([], {})
    {}
    """
    live = {w.metadata.uid: w for w in workloads if w.metadata.uid}
    out: dict[str, Owner] = {}
    for node, held in records.items():
        uid = held.record.workload_uid
        if uid in live:
            out[node] = Owner(uid=uid, key=live[uid].key)
    # Oldest first, so the first status to name a node is its owner's. A workload being
    # deleted holds its nodes by their records only: it releases them before it goes.
    staying = [w for w in live.values() if not w.metadata.deletion_timestamp]
    for workload in sorted(staying, key=lambda w: (w.metadata.creation_timestamp, w.key)):
        for node in workload.nodes:
            if node not in out:
                out[node] = Owner(uid=workload.metadata.uid, key=workload.key, by="status")
    return out


def taken(
    workload: Workload, nodes: Iterable[str], holders: Mapping[str, Owner]
) -> dict[str, Owner]:
    """The ``nodes`` another workload holds, with who holds them."""
    out: dict[str, Owner] = {}
    for node in nodes:
        owner = holders.get(node)
        if owner is not None and owner.uid != workload.metadata.uid:
            out[node] = owner
    return out


def describe(conflicts: Mapping[str, Owner]) -> str:
    """``node-a, node-b (NeuronUltraServerWorkload ns/x)``, grouped by holder."""
    by_owner: dict[str, list[str]] = {}
    for node, owner in sorted(conflicts.items()):
        by_owner.setdefault(str(owner), []).append(node)
    return "; ".join(f"{', '.join(nodes)} ({owner})" for owner, nodes in by_owner.items())
