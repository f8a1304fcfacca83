"""The objects the operator writes, built from what it knows (no I/O).

The ResourceClaimTemplate asks for one ``neuron_node`` device per pod, restricted to the
workload's nodes by the identity their node devices publish (``ultraserverId`` and
``ultraserverNodeId``): those attributes exist as soon as a node's pool does, so pods can be
scheduled without waiting for the ``workloadId`` tag. Claims made from it carry the
workload's name and UID as labels, which the kubelet plugin checks against the node's
allocation record.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from neuron_dra_common.driver import NODE_RESOURCE_TYPE
from neuron_dra_common.ultraserver import (
    GROUP,
    MODE_FOUR_NODE,
    MODE_SINGLE_NODE,
    MODE_TWO_NODE_HORIZONTAL,
    MODE_TWO_NODE_VERTICAL,
    NAMESPACE,
    STORAGE_VERSION,
    WORKLOAD_LABEL,
    WORKLOAD_UID_LABEL,
)

from neuron_dra_ultraserver_operator.discovery import Member, UltraServerView
from neuron_dra_ultraserver_operator.model import TRACEPARENT, AllocationRecord, Workload

__all__ = [
    "REQUEST",
    "SERVER_LABEL",
    "claim_template",
    "device_selectors",
    "node_selector",
    "owner_reference",
    "selectors",
    "ultraserver_object",
    "ultraserver_status",
]

REQUEST = "neurons"
SERVER_LABEL = f"{GROUP}/server-id"
_A = f"device.attributes['{GROUP}']"

Obj = dict[str, Any]


def owner_reference(workload: Workload) -> Obj:
    return {
        "apiVersion": f"{GROUP}/{STORAGE_VERSION}",
        "kind": "NeuronUltraServerWorkload",
        "name": workload.metadata.name,
        "uid": workload.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": False,
    }


def workload_labels(workload: Workload) -> dict[str, str]:
    return {WORKLOAD_LABEL: workload.metadata.name, WORKLOAD_UID_LABEL: workload.metadata.uid}


def node_selector(records: Sequence[AllocationRecord], members: Mapping[str, Member]) -> str:
    """The CEL expression that matches exactly the node devices of ``records``' nodes."""
    by_server: dict[str, list[int]] = {}
    for record in records:
        for node in record.nodes:
            member = members.get(node.node_name)
            server = (member.device_server_id if member else "") or record.server_id
            node_id = node.node_id
            if member is not None and member.device_node_id is not None:
                node_id = member.device_node_id
            by_server.setdefault(server, []).append(node_id)
    terms = [
        f"({_A}.ultraserverId == '{server}' && {_A}.ultraserverNodeId in "
        f"[{', '.join(str(i) for i in sorted(set(ids)))}])"
        for server, ids in sorted(by_server.items())
    ]
    return f"{_A}.resourceType == '{NODE_RESOURCE_TYPE}' && ({' || '.join(terms) or 'false'})"


def claim_template(
    workload: Workload,
    records: Sequence[AllocationRecord],
    members: Mapping[str, Member],
    *,
    traceparent: str = "",
) -> Obj:
    """The ResourceClaimTemplate of an allocated workload (``resource.k8s.io/v1``).

    With ``traceparent``, the claims made from it carry it as the annotation
    :data:`~neuron_dra_ultraserver_operator.model.TRACEPARENT`.
    """
    labels = workload_labels(workload)
    claim_meta: Obj = {"labels": labels}
    if traceparent:
        claim_meta["annotations"] = {TRACEPARENT: traceparent}
    config = [
        {
            "requests": [REQUEST],
            "opaque": {
                "driver": GROUP,
                "parameters": {
                    "apiVersion": f"{GROUP}/v1",
                    "kind": "UltraServerConfig",
                    "ultraserverMode": workload.spec.topology_size,
                },
            },
        },
        {
            "requests": [REQUEST],
            "opaque": {
                "driver": GROUP,
                "parameters": {
                    "apiVersion": f"{GROUP}/v1",
                    "kind": "NeuronConfig",
                    "logicalNeuronCore": workload.spec.config.logical_neuron_core,
                },
            },
        },
    ]
    return {
        "metadata": {
            "name": workload.template_name,
            "namespace": workload.metadata.namespace,
            "labels": labels,
            "ownerReferences": [owner_reference(workload)],
        },
        "spec": {
            "metadata": claim_meta,
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": REQUEST,
                            "exactly": {
                                "deviceClassName": GROUP,
                                "allocationMode": "ExactCount",
                                "count": 1,
                                "selectors": [
                                    {"cel": {"expression": node_selector(records, members)}}
                                ],
                            },
                        }
                    ],
                    "config": config,
                }
            },
        },
    }


def selectors(template: Obj) -> tuple[str, ...]:
    """The CEL selectors of a ResourceClaimTemplate's requests (which nodes its claims take)."""
    return device_selectors(((template.get("spec") or {}).get("spec") or {}).get("devices") or {})


def device_selectors(devices: Obj) -> tuple[str, ...]:
    """The CEL selectors of the requests in ``devices`` (a claim's ``spec.devices``, copied
    from its template's when the claim was made)."""
    return tuple(
        str((selector.get("cel") or {}).get("expression") or "")
        for request in devices.get("requests") or ()
        for selector in (request.get("exactly") or {}).get("selectors") or ()
    )


def _link(modes: tuple[int, ...], mode: int) -> str:
    if not modes:
        return "unknown"
    return "up" if mode in modes else "down"


def ultraserver_object(view: UltraServerView) -> Obj:
    """The NeuronUltraServer's metadata and spec."""
    return {
        "metadata": {
            "name": view.name,
            "namespace": NAMESPACE,
            "labels": {SERVER_LABEL: view.server_id[:63]},
        },
        "spec": {
            "instanceType": view.instance_type or "unknown",
            "serverId": view.server_id,
            "capacityBlockId": view.capacity_block_id,
            "topology": [
                {
                    "nodeId": m.node_id,
                    "nodeName": m.node_name,
                    "serverId2": m.server_id_2,
                    "linkStatusHorizontal": _link(m.modes, MODE_TWO_NODE_HORIZONTAL),
                    "linkStatusVertical": _link(m.modes, MODE_TWO_NODE_VERTICAL),
                }
                for m in view.members
            ],
        },
    }


def ultraserver_status(
    view: UltraServerView,
    workloads: Iterable[Workload],
    *,
    generation: int,
    failed: Mapping[str, str] | None = None,
    previous: Obj | None = None,
    now: str = "",
) -> Obj:
    """The NeuronUltraServer's status: member health and every workload's share, with the
    conditions ``Ready`` (every member healthy) and ``Degraded`` (some member is not: NotReady,
    declared lost, or a device failed). ``failed``: node -> why (from the health stream);
    ``previous``: the status shown now (its conditions keep their transition times)."""
    failed = failed or {}
    held: dict[str, str] = {}
    allocations = []
    for workload in sorted(workloads, key=lambda w: w.key):
        for record in workload.status.allocations:
            if record.ultra_server != view.name:
                continue
            for node in record.nodes:
                held[node.node_name] = workload.key
            allocations.append(
                {
                    "workloadRef": workload.key,
                    "workloadUid": workload.metadata.uid,
                    "allocatedNodes": [n.node_name for n in record.nodes],
                    "leaderNodeName": record.leader_node_name,
                    "nodeCount": len(record.nodes),
                    "ultraserverIndex": record.ultraserver_index,
                    "phase": "Bound" if workload.status.state == "Allocated" else "Pending",
                    **(
                        {"allocatedAt": workload.status.allocation_time}
                        if workload.status.allocation_time
                        else {}
                    ),
                }
            )
    healthy = [m for m in view.members if m.healthy and m.node_name not in failed]
    allocated = sum(1 for m in view.members if m.node_name in held)
    modes = view.modes
    sizes = {MODE_SINGLE_NODE: 1, MODE_TWO_NODE_VERTICAL: 2, MODE_TWO_NODE_HORIZONTAL: 2}
    sizes[MODE_FOUR_NODE] = 4
    available = sorted({sizes[m] for m in modes if m in sizes})
    if not healthy:
        state = "Unavailable"
    elif allocated == 0:
        state = "Available"
    elif allocated >= len(view.members):
        state = "FullyAllocated"
    else:
        state = "PartiallyAllocated"
    return {
        "state": state,
        "nodeCount": len(view.members),
        "healthyNodeCount": len(healthy),
        "allocatedNodeCount": allocated,
        "supportedModes": list(modes),
        "availableConfigurations": available,
        "nodes": [
            {
                "nodeName": m.node_name,
                "nodeId": m.node_id,
                "healthy": m.healthy and m.node_name not in failed,
                **(
                    {"reason": failed.get(m.node_name) or m.reason}
                    if m.reason or m.node_name in failed
                    else {}
                ),
                **({"allocatedTo": held[m.node_name]} if m.node_name in held else {}),
            }
            for m in view.members
        ],
        "allocations": allocations,
        "observedGeneration": generation,
        "conditions": _conditions(
            view,
            sick=[m.node_name for m in view.members if m not in healthy],
            generation=generation,
            previous=previous or {},
            now=now,
        ),
    }


def _conditions(
    view: UltraServerView, *, sick: list[str], generation: int, previous: Obj, now: str
) -> list[Obj]:
    shown = {c.get("type"): c for c in previous.get("conditions") or ()}
    message = f"not healthy: {', '.join(sick)}" if sick else f"{len(view.members)} nodes healthy"
    reason = "NodesUnhealthy" if sick else "AllNodesHealthy"
    out = []
    for kind, value in (("Ready", not sick), ("Degraded", bool(sick))):
        status = "True" if value else "False"
        before = shown.get(kind) or {}
        since = before.get("lastTransitionTime") if before.get("status") == status else None
        out.append(
            {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": since or now,
                "observedGeneration": generation,
            }
        )
    return out
