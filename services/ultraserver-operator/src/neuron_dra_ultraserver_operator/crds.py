"""The NeuronUltraServer and NeuronUltraServerWorkload CRDs, rendered from one schema.

Both kinds are served as ``v1beta1`` (the spelling AWS's documents use, and the storage
version) and ``v1``, with the same schema, so no conversion is needed. Validation lives in
the schema so ``kubectl apply`` refuses bad input with a message that names the field:
enums and ranges where OpenAPI says it well, CEL rules where it does not (immutability,
``topologySize`` in 1, 2, 4, ``serverCount`` >= 1).

``python -m neuron_dra_ultraserver_operator.crds DIR`` writes the manifests and their
kustomization into ``DIR`` (``deploy/kustomize/base/crds``); a test checks they are current.

State names follow the table of workload states in AWS's Neuron UltraServer operator guide
(Pending, Allocating, Allocated, PartiallyAllocated, Failed, Deallocating). The guide's status
example shows ``state: Bound``, a value its own table does not list: ``Bound`` is the phase
of one allocation inside a NeuronUltraServer, never a workload state.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any, Final

import yaml
from neuron_dra_common.ultraserver import (
    FAILURE_STRATEGIES,
    GROUP,
    NUS_STATES,
    NUSW_STATES,
    SERVED_VERSIONS,
    STORAGE_VERSION,
    TOPOLOGY_SIZES,
)

__all__ = ["FILES", "render", "ultraserver_crd", "workload_crd", "write"]

Schema = dict[str, Any]

_DNS_SUBDOMAIN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


def _string(description: str, **extra: Any) -> Schema:
    return {"type": "string", "description": description, **extra}


def _int(description: str, **extra: Any) -> Schema:
    return {"type": "integer", "description": description, **extra}


def _list(items: Schema, description: str, **extra: Any) -> Schema:
    return {"type": "array", "description": description, "items": items, **extra}


def _object(description: str, properties: Schema, **extra: Any) -> Schema:
    return {"type": "object", "description": description, "properties": properties, **extra}


def _conditions() -> Schema:
    condition = _object(
        "One aspect of the object's state, as kubectl describe shows it.",
        {
            "type": _string("Kind of condition, e.g. Allocated or Ready.", maxLength=316),
            "status": _string("True, False or Unknown.", enum=["True", "False", "Unknown"]),
            "reason": _string("One CamelCase word saying why.", maxLength=1024),
            "message": _string("What a person should know.", maxLength=32768),
            "lastTransitionTime": _string("When status last changed.", format="date-time"),
            "observedGeneration": _int("The generation this was computed for.", minimum=0),
        },
        required=["type", "status", "lastTransitionTime"],
    )
    return _list(
        condition,
        "Conditions, one per type.",
        **{"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )


def _immutable(field: str) -> list[Schema]:
    return [{"rule": "self == oldSelf", "message": f"{field} is immutable"}]


def _one_of(values: tuple[int, ...]) -> str:
    return ", ".join(str(v) for v in values)


def _workload_schema() -> Schema:
    sizes = _one_of(TOPOLOGY_SIZES)
    spec = _object(
        "What the workload needs: serverCount UltraServers of topologySize nodes each.",
        {
            "instanceType": _string(
                "Instance type of the UltraServer nodes, e.g. trn2u.48xlarge.",
                minLength=1,
                maxLength=64,
                **{"x-kubernetes-validations": _immutable("spec.instanceType")},
            ),
            "topologySize": _int(
                f"Nodes per UltraServer: one of {sizes}.",
                **{
                    "x-kubernetes-validations": [
                        {
                            "rule": f"self in [{sizes}]",
                            # A static message: string(self) in a messageExpression has an
                            # unbounded estimated cost, and the apiserver refuses the CRD.
                            "message": f"spec.topologySize must be one of {sizes}",
                        }
                    ]
                },
            ),
            "serverCount": _int(
                "How many UltraServers to allocate (all or nothing).",
                **{
                    "x-kubernetes-validations": [
                        {
                            "rule": "self >= 1",
                            "message": "spec.serverCount must be at least 1",
                        }
                    ]
                },
            ),
            "allocationPolicy": _object(
                "What happens when an allocated node fails.",
                {
                    "failureStrategy": _string(
                        "NoOp reports only; RestartAll reallocates everything; ReplaceAffected "
                        "(also spelled MigrateAffected) replaces the affected nodes.",
                        enum=list(FAILURE_STRATEGIES),
                        default="NoOp",
                    )
                },
                default={},
            ),
            "resourceClaimTemplate": _object(
                "The ResourceClaimTemplate the operator generates.",
                {
                    "name": _string(
                        "Its name; default: the workload's name.",
                        maxLength=253,
                        pattern=_DNS_SUBDOMAIN,
                    )
                },
            ),
            "config": _object(
                "Device configuration passed to every pod's claim.",
                {
                    "logicalNeuronCore": _int(
                        "Logical NeuronCore size (LNC): 1 or 2.", enum=[1, 2], default=2
                    )
                },
                default={},
            ),
        },
        required=["instanceType", "topologySize", "serverCount"],
    )
    node = _object(
        "One allocated node and its rank in the job.",
        {
            "nodeName": _string("The node."),
            "nodeId": _int("Its node id in the UltraServer (node_id_4).", minimum=0),
            "topologyId": _int(
                "NEURON_GLOBAL_TOPOID: ultraserverIndex * topologySize + position.", minimum=0
            ),
        },
    )
    allocation = _object(
        "The share of one UltraServer.",
        {
            "ultraServer": _string("The NeuronUltraServer's name."),
            "serverId": _string("The driver's server id for topologySize."),
            "ultraserverIndex": _int("Position of this UltraServer in the job.", minimum=0),
            "mode": _int("The driver's ultraserver_mode enum.", minimum=0, maximum=4),
            "leaderNodeName": _string("The node with topology id ultraserverIndex * size."),
            "nodes": _list(node, "Allocated nodes by node id."),
        },
    )
    status = _object(
        "What the operator did.",
        {
            "state": _string("Allocation state.", enum=list(NUSW_STATES)),
            "reason": _string("Why the workload is in this state (one CamelCase word)."),
            "message": _string("The allocator's explanation, per UltraServer."),
            "workloadId": _string("The workloadId attribute on the allocated devices."),
            "resourceClaimTemplate": _string("The generated ResourceClaimTemplate."),
            "allocatedUltraServers": _list(_string("A NeuronUltraServer name."), "Allocated."),
            "totalNodesAllocated": _int("Nodes allocated in all.", minimum=0),
            "allocationTime": _string("When the allocation completed.", format="date-time"),
            "topology0Host": _string("NEURON_GLOBAL_TOPOID0_HOST: the rank-0 node."),
            "allocations": _list(allocation, "Per UltraServer."),
            "observedGeneration": _int("The generation this status describes.", minimum=0),
            "conditions": _conditions(),
        },
    )
    return _object(
        "A user's request for whole UltraServers, as AWS's Neuron UltraServer operator guide"
        " describes it.",
        {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
        required=["spec"],
    )


def _ultraserver_schema() -> Schema:
    link = {"type": "string", "enum": ["up", "down", "unknown"]}
    member = _object(
        "One node of the UltraServer.",
        {
            "nodeId": _int("node_id_4 of the node.", minimum=0, maximum=3),
            "nodeName": _string("The node's name."),
            "serverId2": _string("The driver's 2-node server id of the node."),
            "linkStatusHorizontal": {**link, "description": "NeuronLink to the horizontal pair."},
            "linkStatusVertical": {**link, "description": "NeuronLink to the vertical pair."},
        },
        required=["nodeId", "nodeName"],
    )
    spec = _object(
        "The UltraServer as discovered from its nodes.",
        {
            "instanceType": _string(
                "Instance type of its nodes.",
                minLength=1,
                **{"x-kubernetes-validations": _immutable("spec.instanceType")},
            ),
            "serverId": _string("The driver's 4-node server id (ultraserverId)."),
            "capacityBlockId": _string("The capacity block the nodes were launched in."),
            "topology": _list(member, "Member nodes by node id.", maxItems=4),
        },
        required=["instanceType"],
    )
    node_status = _object(
        "Whether a member node can be allocated.",
        {
            "nodeName": _string("The node."),
            "nodeId": _int("node_id_4.", minimum=0),
            "healthy": {"type": "boolean", "description": "Ready and no unhealthy device."},
            "reason": _string("Why it is not healthy."),
            "allocatedTo": _string("The workload (ns/name) holding it."),
        },
    )
    allocation = _object(
        "One workload's share of this UltraServer.",
        {
            "workloadRef": _string("namespace/name of the NeuronUltraServerWorkload."),
            "workloadUid": _string("Its UID."),
            "allocatedNodes": _list(_string("A node."), "Allocated nodes by node id."),
            "leaderNodeName": _string("The first of them."),
            "nodeCount": _int("How many nodes.", minimum=1, maximum=4),
            "ultraserverIndex": _int("This UltraServer's position in the workload.", minimum=0),
            "phase": _string(
                "Pending: reserved, awaiting the whole gang; Bound: the workload may run.",
                enum=["Pending", "Bound"],
            ),
            "allocatedAt": _string("When it was allocated.", format="date-time"),
        },
    )
    status = _object(
        "Health and allocations.",
        {
            "state": _string("Allocation state.", enum=list(NUS_STATES)),
            "nodeCount": _int("Member nodes.", minimum=0),
            "healthyNodeCount": _int("Member nodes that can be allocated.", minimum=0),
            "allocatedNodeCount": _int("Member nodes held by workloads.", minimum=0),
            "supportedModes": _list(
                {"type": "integer"}, "The driver's ultraserver_mode enums all nodes support."
            ),
            "availableConfigurations": _list(
                {"type": "integer"}, "Node counts (1, 2, 4) this UltraServer can offer."
            ),
            "nodes": _list(node_status, "Per member node."),
            "allocations": _list(allocation, "Per workload."),
            "observedGeneration": _int("The generation this status describes.", minimum=0),
            "conditions": _conditions(),
        },
    )
    return _object(
        "An UltraServer: NeuronLink-connected nodes allocated as a unit (system-generated).",
        {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    )


def _column(name: str, path: str, kind: str = "string", **extra: Any) -> Schema:
    return {"name": name, "type": kind, "jsonPath": path, **extra}


def _crd(
    *, kind: str, plural: str, short: str, schema: Schema, columns: list[Schema]
) -> dict[str, Any]:
    versions: list[dict[str, Any]] = [
        {
            "name": version,
            "served": True,
            "storage": version == STORAGE_VERSION,
            "schema": {"openAPIV3Schema": copy.deepcopy(schema)},
            "subresources": {"status": {}},
            "additionalPrinterColumns": copy.deepcopy(columns),
        }
        for version in SERVED_VERSIONS
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": [short],
                "categories": ["neuron"],
            },
            "scope": "Namespaced",
            "versions": versions,
        },
    }


def workload_crd() -> dict[str, Any]:
    """The NeuronUltraServerWorkload CRD (``nusw``)."""
    age = _column("Age", ".metadata.creationTimestamp", "date")
    return _crd(
        kind="NeuronUltraServerWorkload",
        plural="neuronultraserverworkloads",
        short="nusw",
        schema=_workload_schema(),
        columns=[
            _column("State", ".status.state"),
            _column("Size", ".spec.topologySize", "integer"),
            _column("Servers", ".spec.serverCount", "integer"),
            _column("Nodes", ".status.totalNodesAllocated", "integer"),
            _column("Instance", ".spec.instanceType", priority=1),
            _column("Reason", ".status.reason", priority=1),
            age,
        ],
    )


def ultraserver_crd() -> dict[str, Any]:
    """The NeuronUltraServer CRD (``nus``)."""
    return _crd(
        kind="NeuronUltraServer",
        plural="neuronultraservers",
        short="nus",
        schema=_ultraserver_schema(),
        columns=[
            _column("State", ".status.state"),
            _column("Instance", ".spec.instanceType"),
            _column("Nodes", ".status.nodeCount", "integer"),
            _column("Healthy", ".status.healthyNodeCount", "integer"),
            _column("Allocated", ".status.allocatedNodeCount", "integer"),
            _column("Server", ".spec.serverId", priority=1),
            _column("Age", ".metadata.creationTimestamp", "date"),
        ],
    )


class _PlainDumper(yaml.SafeDumper):
    """Writes repeated values out in full: anchors make a manifest hard to read."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


_HEADER: Final = "# Generated by `python -m neuron_dra_ultraserver_operator.crds`; do not edit.\n"

#: File name -> content, as written into ``deploy/kustomize/base/crds``.
FILES: Final = ("neuronultraservers.yaml", "neuronultraserverworkloads.yaml", "kustomization.yaml")


def render() -> dict[str, str]:
    """Every file of the CRD directory, by name."""

    def dump(obj: dict[str, Any]) -> str:
        return _HEADER + yaml.dump(obj, Dumper=_PlainDumper, sort_keys=False, width=100)

    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": list(FILES[:2]),
    }
    return {
        FILES[0]: dump(ultraserver_crd()),
        FILES[1]: dump(workload_crd()),
        FILES[2]: dump(kustomization),
    }


def write(directory: Path) -> list[Path]:
    """Write the rendered files into ``directory``; returns the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render().items():
        path = directory / name
        path.write_text(text)
        written.append(path)
    return written


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m neuron_dra_ultraserver_operator.crds DIRECTORY", file=sys.stderr)
        raise SystemExit(2)
    for written_path in write(Path(sys.argv[1])):
        print(written_path)
