"""Typed views of the objects the operator reads (no I/O; the API resources are in
``resources``)."""

from __future__ import annotations

from typing import Any, Final

import msgspec
from neuron_dra_common.driver import TRACEPARENT_ANNOTATION
from neuron_dra_common.ultraserver import GROUP

__all__ = [
    "FIELD_MANAGER",
    "FINALIZER",
    "TRACEPARENT",
    "AllocationRecord",
    "NodeRecord",
    "Workload",
    "WorkloadSpec",
    "WorkloadStatus",
    "workload_from_api",
]

FIELD_MANAGER: Final = "neuron-ultraserver-operator"
FINALIZER: Final = f"{GROUP}/ultraserver-operator"
#: The W3C trace context of the reconcile that allocated a workload (see the driver contract).
TRACEPARENT: Final = TRACEPARENT_ANNOTATION


class _Camel(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    pass


class Meta(_Camel, frozen=True, kw_only=True):
    name: str
    namespace: str = ""
    uid: str = ""
    generation: int = 0
    deletion_timestamp: str | None = None
    finalizers: tuple[str, ...] = ()
    creation_timestamp: str = ""
    resource_version: str = ""


class AllocationPolicy(_Camel, frozen=True, kw_only=True):
    failure_strategy: str = "NoOp"


class TemplateRef(_Camel, frozen=True, kw_only=True):
    name: str = ""


class WorkloadConfig(_Camel, frozen=True, kw_only=True):
    logical_neuron_core: int = 2


class WorkloadSpec(_Camel, frozen=True, kw_only=True):
    instance_type: str
    topology_size: int
    server_count: int
    allocation_policy: AllocationPolicy = msgspec.field(default_factory=AllocationPolicy)
    resource_claim_template: TemplateRef = msgspec.field(default_factory=TemplateRef)
    config: WorkloadConfig = msgspec.field(default_factory=WorkloadConfig)


class NodeRecord(_Camel, frozen=True, kw_only=True):
    node_name: str
    node_id: int
    topology_id: int


class AllocationRecord(_Camel, frozen=True, kw_only=True):
    """One UltraServer unit of an allocation, as the workload's status records it."""

    ultra_server: str
    server_id: str
    ultraserver_index: int
    mode: int
    leader_node_name: str
    nodes: tuple[NodeRecord, ...]


class WorkloadStatus(_Camel, frozen=True, kw_only=True):
    state: str = ""
    reason: str = ""
    message: str = ""
    allocations: tuple[AllocationRecord, ...] = ()
    allocation_time: str = ""
    resource_claim_template: str = ""
    observed_generation: int = 0


class Workload(msgspec.Struct, frozen=True, kw_only=True):
    metadata: Meta
    spec: WorkloadSpec
    status: WorkloadStatus = msgspec.field(default_factory=WorkloadStatus)
    #: ``status`` as the API shows it, every field (a write that would change none is skipped)
    reported: dict[str, Any] = msgspec.field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.metadata.namespace}/{self.metadata.name}"

    @property
    def template_name(self) -> str:
        return self.spec.resource_claim_template.name or self.metadata.name

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(n.node_name for a in self.status.allocations for n in a.nodes)

    def __str__(self) -> str:
        return f"NeuronUltraServerWorkload {self.key}"


def workload_from_api(obj: dict[str, Any]) -> Workload:
    """Decode a NeuronUltraServerWorkload as the API returns it.

    Raises :class:`msgspec.ValidationError` naming the path of a field of the wrong type
    (the CRD schema normally refuses such objects first).
    """
    workload = msgspec.convert(obj, type=Workload, strict=False)
    return msgspec.structs.replace(workload, reported=dict(obj.get("status") or {}))
