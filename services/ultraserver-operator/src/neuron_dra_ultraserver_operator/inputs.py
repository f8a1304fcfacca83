"""What the decider is told besides the workload: the fleet, the node records, the facts
of the pass (no I/O)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import msgspec
from neuron_dra_common.events import AllocationDecided
from neuron_dra_common.ultraserver import NodeAllocation

from neuron_dra_ultraserver_operator.discovery import Member

__all__ = ["Facts", "FleetView", "Held", "Owner", "Refusal"]


@dataclass(frozen=True)
class FleetView:
    """The fleet as the decider needs it, by node name."""

    #: node -> its place in its UltraServer (as discovery sees it)
    members: Mapping[str, Member]
    #: node -> the NeuronUltraServer it belongs to
    names: Mapping[str, str]
    #: node -> the server id of its UltraServer
    server_ids: Mapping[str, str]
    #: NeuronUltraServer name -> its server id
    servers: Mapping[str, str]
    #: node -> whether it is Ready; a node that is gone is absent
    ready: Mapping[str, bool]
    #: node -> why it is failed although Kubernetes may still call it Ready: declared lost
    #: by the failure detector, or a device with an uncorrectable error (from the bus)
    failed: Mapping[str, str] = field(default_factory=dict)


class Held(msgspec.Struct, frozen=True, kw_only=True):
    """The allocation record a node carries, and the trace context written beside it."""

    record: NodeAllocation
    traceparent: str = ""


class Owner(msgspec.Struct, frozen=True, kw_only=True):
    """The workload that holds a node."""

    uid: str
    #: ``namespace/name``
    key: str
    #: where the ownership is recorded: ``node`` (the Node's record) or ``status``
    by: str = "node"

    def __str__(self) -> str:
        return f"NeuronUltraServerWorkload {self.key}"


class Refusal(msgspec.Struct, frozen=True, kw_only=True):
    """A write the executor did not make: the object it would have changed belongs to
    another workload (or to no workload: a template someone else made)."""

    #: ``ResourceClaimTemplate`` or ``Node``
    kind: str
    name: str
    #: who holds it: a Node's workload (``namespace/name``); a template's owner, as a person
    #: would name it
    holder: str


class Facts(msgspec.Struct, frozen=True, kw_only=True):
    """What the pass knows besides the objects: the time, settings, answers to its queries."""

    now: str
    #: the W3C traceparent of this pass's span; empty when it is not recorded
    traceparent: str = ""
    claim_wait_seconds: float = 300.0
    #: the allocator's answer to the placement or confirmation this pass asked for
    answer: AllocationDecided | None = None
    #: the allocator's answer to the replacement of failed units
    replacement: AllocationDecided | None = None
    #: the workload's claims that still exist (deleting); ``None`` until listed
    claims: tuple[str, ...] | None = None
    #: node -> the workload that holds it, as Kubernetes records it (see ``ownership``)
    owners: dict[str, Owner] = msgspec.field(default_factory=dict)
    #: a write the executor refused to make in this pass, and why
    refused: Refusal | None = None
