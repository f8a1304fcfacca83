"""From the allocator's grants to what the operator records (no I/O).

Ranks follow AWS's formula: ``topoID = ultraserverIndex * nodeCount + nodeIndex``, where
``nodeIndex`` is the node's position among its unit's nodes ordered by node id; the rank-0
node of the whole job is ``NEURON_GLOBAL_TOPOID0_HOST``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from neuron_dra_common.events import UltraServerGrant
from neuron_dra_common.ultraserver import NodeAllocation, ultraserver_name

from neuron_dra_ultraserver_operator.model import AllocationRecord, NodeRecord, Workload

__all__ = ["node_allocations", "records_from_grants", "topo0_host", "ultraserver_of"]


def ultraserver_of(grant: UltraServerGrant, *, names: Mapping[str, str]) -> str:
    """The NeuronUltraServer name of a grant: where discovery put its leader node."""
    leader = grant.nodes[0] if grant.nodes else ""
    if leader in names:
        return names[leader]
    # The allocator keys UltraServers by their NeuronUltraServer name already.
    if grant.ultraserver.startswith("us-"):
        return grant.ultraserver
    return ultraserver_name(grant.ultraserver)


def records_from_grants(
    grants: Sequence[UltraServerGrant], *, names: Mapping[str, str]
) -> tuple[AllocationRecord, ...]:
    """The workload's ``status.allocations``; ``names`` maps node -> NeuronUltraServer."""
    records = []
    for grant in sorted(grants, key=lambda g: g.index):
        size = len(grant.nodes)
        ordered = sorted(
            zip(grant.node_ids or range(size), grant.nodes, strict=False), key=lambda p: p[0]
        )
        nodes = tuple(
            NodeRecord(node_name=name, node_id=node_id, topology_id=grant.index * size + position)
            for position, (node_id, name) in enumerate(ordered)
        )
        records.append(
            AllocationRecord(
                ultra_server=ultraserver_of(grant, names=names),
                server_id=grant.server_id,
                ultraserver_index=grant.index,
                mode=grant.mode,
                leader_node_name=nodes[0].node_name,
                nodes=nodes,
            )
        )
    return tuple(records)


def topo0_host(records: Iterable[AllocationRecord]) -> str:
    for record in records:
        for node in record.nodes:
            if node.topology_id == 0:
                return node.node_name
    return ""


def node_allocations(
    workload: Workload,
    records: Sequence[AllocationRecord],
    *,
    phase: Literal["Pending", "Bound"],
) -> dict[str, NodeAllocation]:
    """What to write on each allocated node, by node name."""
    host = topo0_host(records)
    total = sum(len(r.nodes) for r in records)
    out: dict[str, NodeAllocation] = {}
    for record in records:
        for position, node in enumerate(record.nodes):
            out[node.node_name] = NodeAllocation(
                workload=workload.key,
                workload_uid=workload.metadata.uid,
                workload_id=workload.metadata.name,
                phase=phase,
                nodes=len(record.nodes),
                mode=record.mode,
                server_id=record.server_id,
                node_id=position,
                topo_id=node.topology_id,
                topo0_host=host,
                ultraserver=record.ultra_server,
                ultraserver_index=record.ultraserver_index,
                total_nodes=total,
            )
    return out
