"""What the UltraServer parts agree on: API names, states, labels, the node allocation record.

The operator writes, on every node it allocates, the annotation :data:`NODE_ALLOCATION`
holding a :class:`NodeAllocation` (JSON). Two readers rely on it:

- the slice publisher tags every device of that node with ``workloadId``
  (:data:`WORKLOAD_ID_ATTRIBUTE`) = :attr:`NodeAllocation.workload_id`;
- the kubelet plugin prepares the node's devices only for claims of that workload, and
  takes the UltraServer runtime variables (mode, server id, node id, topology id, rank-0
  host) from it. It can read its own Node with the node's credentials, which it cannot do
  for the NeuronUltraServer objects.

Claims of a workload carry :data:`WORKLOAD_LABEL` and :data:`WORKLOAD_UID_LABEL` (the
operator's ResourceClaimTemplate sets them, the claim controller copies them).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Final, Literal

import msgspec

__all__ = [
    "CAPACITY_BLOCK_LABEL",
    "FAILURE_STRATEGIES",
    "GROUP",
    "MODE_FOUR_NODE",
    "MODE_LABEL",
    "MODE_SINGLE_NODE",
    "MODE_TWO_NODE_HORIZONTAL",
    "MODE_TWO_NODE_VERTICAL",
    "NAMESPACE",
    "NODE_ALLOCATION",
    "NODE_ID_2_LABEL",
    "NODE_ID_4_LABEL",
    "NUSW_STATES",
    "NUS_STATES",
    "SERVED_VERSIONS",
    "SERVER_ID_2_LABEL",
    "SERVER_ID_4_LABEL",
    "STORAGE_VERSION",
    "TOPOLOGY_SIZES",
    "WORKLOAD_ID_ATTRIBUTE",
    "WORKLOAD_LABEL",
    "WORKLOAD_UID_LABEL",
    "NodeAllocation",
    "NodeAllocationError",
    "encode_node_allocation",
    "modes_for_size",
    "node_allocation",
    "sorted_modes",
    "ultraserver_name",
]

GROUP: Final = "neuron.aws.com"
#: The spelling of AWS's Neuron UltraServer operator guide; stored, and served beside ``v1``
#: with the same schema.
STORAGE_VERSION: Final = "v1beta1"
SERVED_VERSIONS: Final = ("v1beta1", "v1")
#: Where NeuronUltraServers live (AWS's Neuron UltraServer operator guide lists them with
#: ``-n neuron-dra-driver``).
NAMESPACE: Final = "neuron-dra-driver"

TOPOLOGY_SIZES: Final = (1, 2, 4)
#: AWS's chart spells ReplaceAffected as MigrateAffected; both are accepted.
FAILURE_STRATEGIES: Final = ("NoOp", "RestartAll", "ReplaceAffected", "MigrateAffected")
NUSW_STATES: Final = (
    "Pending",
    "Allocating",
    "Allocated",
    "PartiallyAllocated",
    "Failed",
    "Deallocating",
)
#: The three states of AWS's Neuron UltraServer operator guide, and Unavailable when no member
#: node can be allocated.
NUS_STATES: Final = ("Available", "PartiallyAllocated", "FullyAllocated", "Unavailable")

# The driver's ultraserver_mode enum (NEURON_RT_ULTRASERVER_MODE), not node counts.
MODE_FOUR_NODE: Final = 1
MODE_TWO_NODE_HORIZONTAL: Final = 2
MODE_TWO_NODE_VERTICAL: Final = 3
MODE_SINGLE_NODE: Final = 4

SERVER_ID_4_LABEL: Final = "neuron.amazonaws.com/ultraserver-server-id-4"
SERVER_ID_2_LABEL: Final = "neuron.amazonaws.com/ultraserver-server-id-2"
NODE_ID_4_LABEL: Final = "neuron.amazonaws.com/ultraserver-node-id-4"
NODE_ID_2_LABEL: Final = "neuron.amazonaws.com/ultraserver-node-id-2"
MODE_LABEL: Final = "neuron.amazonaws.com/ultraserver-mode"
CAPACITY_BLOCK_LABEL: Final = "topology.k8s.aws/capacity-block-id"

NODE_ALLOCATION: Final = f"{GROUP}/ultraserver-allocation"
WORKLOAD_LABEL: Final = f"{GROUP}/workload"
WORKLOAD_UID_LABEL: Final = f"{GROUP}/workload-uid"
WORKLOAD_ID_ATTRIBUTE: Final = "workloadId"

_NOT_DNS = re.compile(r"[^a-z0-9-]+")


def modes_for_size(size: int) -> tuple[int, ...]:
    """The driver's mode enums that give ``size`` nodes, preferred first.

    >>> modes_for_size(2)
    (3, 2)
    """
    return {
        1: (MODE_SINGLE_NODE,),
        2: (MODE_TWO_NODE_VERTICAL, MODE_TWO_NODE_HORIZONTAL),
        4: (MODE_FOUR_NODE,),
    }.get(size, ())


def ultraserver_name(server_id: str) -> str:
    """The NeuronUltraServer name for a server id (or capacity block id).

    >>> ultraserver_name("0A1B2C3D4E5F6071")
    'us-0a1b2c3d4e5f6071'
    """
    cleaned = _NOT_DNS.sub("-", server_id.lower()).strip("-")
    if not cleaned:
        raise ValueError(f"UltraServer id {server_id!r} has no usable characters for a name")
    return f"us-{cleaned}"[:63].rstrip("-")


class NodeAllocationError(ValueError):
    """The node annotation does not hold a valid :class:`NodeAllocation`."""


class NodeAllocation(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """One node's place in a workload, as the operator records it on the Node.

    ``phase`` is ``Pending`` while the operator is still reserving the rest of the gang and
    ``Bound`` once every node of the workload is recorded; the kubelet plugin prepares only
    ``Bound`` nodes. ``topo_id`` is ``ultraserver_index * nodes + position`` and
    ``topo0_host`` the rank-0 node of the whole job.
    """

    workload: str
    workload_uid: str
    workload_id: str
    phase: Literal["Pending", "Bound"]
    nodes: int
    mode: int
    server_id: str
    node_id: int
    topo_id: int
    topo0_host: str
    ultraserver: str = ""
    ultraserver_index: int = 0
    total_nodes: int = 0

    @property
    def namespace(self) -> str:
        return self.workload.partition("/")[0]

    @property
    def name(self) -> str:
        return self.workload.partition("/")[2]


_encoder: Final = msgspec.json.Encoder(order="deterministic")
_decoder: Final = msgspec.json.Decoder(NodeAllocation)


def encode_node_allocation(allocation: NodeAllocation) -> str:
    """The annotation value (compact JSON, stable key order)."""
    return _encoder.encode(allocation).decode()


def node_allocation(node: str, annotations: Mapping[str, str] | None) -> NodeAllocation | None:
    """The allocation recorded on a node, ``None`` when it has none.

    Raises :class:`NodeAllocationError` naming the node and the bad field.
    """
    raw = (annotations or {}).get(NODE_ALLOCATION)
    if not raw:
        return None
    try:
        return _decoder.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:  # a string that is not UTF-8
        raise NodeAllocationError(f"Node {node}: annotation {NODE_ALLOCATION}: {exc}") from None


def sorted_modes(modes: Sequence[int]) -> tuple[int, ...]:
    """Modes de-duplicated and sorted, as the CRD status lists them."""
    return tuple(sorted(set(modes)))
