"""``ReplaceAffected`` / ``MigrateAffected``: swap only the failed units of a workload.

A unit (one ``ultraserverIndex``) is affected when one of its nodes is NotReady or gone. The
allocator is asked to keep the other units and place the affected ones again, of the same
shape and on other UltraServers, all or nothing. On a grant the workload's status, the node
records (removed from the nodes given up, written on the new ones) and the
ResourceClaimTemplate's node restriction follow, with an Event ``Replaced``. On a refusal
nothing changes and the caller reports the workload PartiallyAllocated with the reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from neuron_dra_ultraserver_operator.model import AllocationRecord, Workload
from neuron_dra_ultraserver_operator.records import records_from_grants

if TYPE_CHECKING:
    from neuron_dra_ultraserver_operator.workloads import WorkloadReconciler

__all__ = ["replace_affected"]


async def replace_affected(
    rec: WorkloadReconciler,
    wl: Workload,
    records: tuple[AllocationRecord, ...],
    affected: set[str],
) -> str | None:
    """Replace the units holding ``affected`` nodes; ``None`` when done, else why not."""
    broken = [r for r in records if any(n.node_name in affected for n in r.nodes)]
    kept = tuple(n.node_name for r in records if r not in broken for n in r.nodes)
    exclude = tuple(
        sorted(
            {
                view.server_id
                for view in rec._fleet().values()
                for member in view.members
                if member.node_name in affected
            }
        )
    )
    if not kept:
        # Every unit failed: nothing to keep, so the workload is placed anew elsewhere.
        await rec._release(wl)
    decided = await rec._ask(wl, nodes=kept, exclude=exclude)
    if not decided.granted:
        return decided.reason or "the allocator refused"
    new = records_from_grants(decided.grants, names=rec._names())
    given_up = {n.node_name for r in records for n in r.nodes} - set(decided.nodes)
    for node in sorted(given_up):
        held = rec._recorded(node)
        if held is not None and held.workload_uid == wl.metadata.uid:
            await rec.writer.node_record(node, None)
    gained = [n for n in decided.nodes if n not in {x.node_name for r in records for x in r.nodes}]
    message = (
        f"replaced {', '.join(sorted(given_up))} with {', '.join(gained)} "
        f"(ultraserverIndex {', '.join(str(r.ultraserver_index) for r in broken)})"
    )
    # Recorded before the new nodes are touched: a crash after this resumes from the status.
    await rec._set(
        wl,
        rec._status(wl, state="Allocating", reason="Replacing", message=message, records=new),
    )
    await rec.writer.event(wl, reason="Replaced", message=message, warning=True)
    rec._changed(r.ultra_server for r in records + new)
    replaced = msgspec.structs.replace(
        wl, status=msgspec.structs.replace(wl.status, allocations=new, state="Allocating")
    )
    await rec._bind(replaced, new)
    return None
