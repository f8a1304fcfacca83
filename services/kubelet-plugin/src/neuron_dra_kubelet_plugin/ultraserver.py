"""UltraServer claims: bound to their workload, with the job's UltraServer placement.

Wraps the plugin's claim source. For every claim it reads this node's Node object (always
current, and readable with the node's own credentials; on a node outside any UltraServer,
which has neither record nor UltraServer labels, only for a workload's claims) and decides:

- the node carries the operator's allocation record (``neuron.aws.com/ultraserver-allocation``):
  its devices are tagged with that workload's ``workloadId`` and are prepared only for claims
  of that workload: the claim's ``neuron.aws.com/workload`` label names it and its
  ``workload-uid`` label must be the UID the record holds (the operator's ResourceClaimTemplate
  sets both; see :func:`check_binding`); the record gives the placement (mode, server id,
  node id, topology id, rank-0 host). While the record is ``Pending`` (the operator has not
  bound the whole gang yet) prepare answers a per-claim error, so the kubelet retries;
- the node has no record: a claim of a workload waits for it (per-claim error); any other
  claim is prepared as without the operator, its placement taken from the node's UltraServer
  labels (the ``UltraServerConfig`` template of AWS's Neuron DRA driver guide): server and node id for the size, the
  node's rank in that UltraServer, and the rank-0 node found among its peers.

:meth:`UltraServerGate.placement` is the preparer's ``placement`` hook: it returns what
:meth:`UltraServerGate.get` decided for the claim just read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from neuron_dra_common.kube import NODES, ApiException
from neuron_dra_common.ultraserver import (
    NODE_ID_2_LABEL,
    NODE_ID_4_LABEL,
    SERVER_ID_2_LABEL,
    SERVER_ID_4_LABEL,
    WORKLOAD_LABEL,
    WORKLOAD_UID_LABEL,
    NodeAllocation,
    NodeAllocationError,
    node_allocation,
)

from neuron_dra_kubelet_plugin.claims import ClaimRef, ResourceClaim
from neuron_dra_kubelet_plugin.config import ConfigError, decode_configs, effective_config
from neuron_dra_kubelet_plugin.edits import UltraServerPlacement
from neuron_dra_kubelet_plugin.plan import PrepareError

__all__ = [
    "NodeReader",
    "UltraServerGate",
    "check_binding",
    "placement_from_labels",
    "placement_from_record",
]

Obj = dict[str, Any]


class ClaimSource(Protocol):
    async def get(self, ref: ClaimRef) -> ResourceClaim | None: ...


class NodeReader(Protocol):
    """The API calls the gate makes (``KubeClient`` has these shapes)."""

    async def get(self, resource: Any, name: str, *, namespace: str | None = None) -> Any: ...

    async def list(
        self, resource: Any, *, namespace: str | None = None, label_selector: str = ""
    ) -> Any: ...


def placement_from_record(record: NodeAllocation) -> UltraServerPlacement:
    return UltraServerPlacement(
        nodes=record.nodes,
        server_id=record.server_id,
        node_id=record.node_id,
        topo_id=record.topo_id,
        topo0_host=record.topo0_host,
        mode=record.mode,
    )


def placement_from_labels(
    node: str, labels: Mapping[str, str], *, size: int, peers: list[Obj]
) -> UltraServerPlacement | None:
    """The placement of a claim made without the operator, from AWS's node labels."""
    if size == 1:
        return UltraServerPlacement(
            nodes=1,
            server_id=labels.get(SERVER_ID_4_LABEL, ""),
            node_id=0,
            topo_id=0,
            topo0_host=node,
        )
    server_label, id_label = (
        (SERVER_ID_4_LABEL, NODE_ID_4_LABEL) if size == 4 else (SERVER_ID_2_LABEL, NODE_ID_2_LABEL)
    )
    server, raw_id = labels.get(server_label, ""), labels.get(id_label, "")
    if not server or not raw_id.isdigit():
        return None
    host = node
    for peer in peers:
        meta = peer.get("metadata") or {}
        plabels = meta.get("labels") or {}
        if plabels.get(server_label) == server and plabels.get(id_label) == "0":
            host = str(meta.get("name") or node)
    return UltraServerPlacement(
        nodes=size, server_id=server, node_id=int(raw_id), topo_id=int(raw_id), topo0_host=host
    )


def check_binding(
    ref: ClaimRef, record: NodeAllocation, *, labels: Mapping[str, str], node: str
) -> None:
    """Refuse a claim that is not of the workload ``record`` binds ``node``'s devices to.

    The claim's labels name its workload and that workload's UID. Anyone who can create a
    claim can set labels, and a workload deleted and created again keeps its name: the UID
    is what tells the bound workload apart, so a claim without it, or with another, is
    refused (the operator's templates always carry both).
    """
    holder = f"NeuronUltraServerWorkload {record.workload} (workloadId {record.workload_id})"
    wanted = labels.get(WORKLOAD_LABEL)
    if not wanted:
        raise PrepareError(
            f"{ref}: node {node}'s devices are bound to {holder}; the claim is not part of "
            f"that workload (it has no label {WORKLOAD_LABEL})"
        )
    if (ref.namespace, wanted) != (record.namespace, record.name):
        raise PrepareError(
            f"{ref}: label {WORKLOAD_LABEL} names NeuronUltraServerWorkload "
            f"{ref.namespace}/{wanted}, but node {node}'s devices are bound to {holder}"
        )
    wanted_uid = labels.get(WORKLOAD_UID_LABEL, "")
    if not wanted_uid:
        raise PrepareError(
            f"{ref}: label {WORKLOAD_UID_LABEL} is missing; node {node}'s devices are bound to "
            f"{holder} with UID {record.workload_uid}, and only claims that carry that UID are "
            "prepared there"
        )
    if wanted_uid != record.workload_uid:
        raise PrepareError(
            f"{ref}: label {WORKLOAD_UID_LABEL} is {wanted_uid}, not the UID "
            f"{record.workload_uid} of {holder} that node {node}'s devices are bound to (a "
            "workload of that name made again, or a label set by hand)"
        )


class UltraServerGate:
    """A claim source that refuses claims a bound UltraServer node must not serve."""

    def __init__(
        self, inner: ClaimSource, *, api: NodeReader, node: str, ultraserver_member: bool = True
    ) -> None:
        self._inner = inner
        self._api = api
        self._node = node
        self._member = ultraserver_member
        self._placements: dict[str, UltraServerPlacement | None] = {}

    def placement(self, ref: ClaimRef) -> UltraServerPlacement | None:
        return self._placements.get(ref.uid)

    async def get(self, ref: ClaimRef) -> ResourceClaim | None:
        claim = await self._inner.get(ref)
        if claim is None:
            return None
        self._placements[ref.uid] = await self._decide(ref, claim)
        return claim

    async def _node_object(self) -> Obj:
        try:
            obj: Obj = await self._api.get(NODES, self._node)
        except ApiException as exc:
            raise PrepareError(f"Node {self._node}: cannot be read: {exc.reason}") from None
        return obj

    def _size(self, ref: ClaimRef, claim: ResourceClaim) -> int | None:
        allocation = claim.status.allocation
        if allocation is None:
            return None
        try:
            configs = decode_configs(allocation.devices.config)
        except ConfigError:
            return None  # plan_prepare reports the bad field
        sizes = {
            effective_config(configs, r.request).ultraserver_mode
            for r in allocation.devices.results
        }
        sizes.discard(None)
        return next(iter(sizes)) if len(sizes) == 1 else None

    async def _decide(self, ref: ClaimRef, claim: ResourceClaim) -> UltraServerPlacement | None:
        if not self._member and not claim.metadata.labels.get(WORKLOAD_LABEL):
            # Only UltraServer members carry the operator's record or AWS's UltraServer
            # labels: reading the Node would find neither, so skip the API round trip.
            size = self._size(ref, claim)
            return (
                None if size is None else placement_from_labels(self._node, {}, size=size, peers=[])
            )
        node = await self._node_object()
        meta = node.get("metadata") or {}
        try:
            record = node_allocation(self._node, meta.get("annotations"))
        except NodeAllocationError as exc:
            raise PrepareError(f"{ref}: {exc}") from None
        labels = claim.metadata.labels
        wanted = labels.get(WORKLOAD_LABEL)
        if record is None:
            if wanted:
                raise PrepareError(
                    f"{ref}: belongs to NeuronUltraServerWorkload {ref.namespace}/{wanted}, but "
                    f"node {self._node} carries no allocation for it yet; waiting for the "
                    "UltraServer operator"
                )
            size = self._size(ref, claim)
            if size is None:
                return None
            peers: list[Obj] = []
            if size > 1:
                selector_label = SERVER_ID_4_LABEL if size == 4 else SERVER_ID_2_LABEL
                value = (meta.get("labels") or {}).get(selector_label, "")
                if value:
                    peers, _ = await self._api.list(
                        NODES, label_selector=f"{selector_label}={value}"
                    )
            return placement_from_labels(
                self._node, meta.get("labels") or {}, size=size, peers=peers
            )
        check_binding(ref, record, labels=labels, node=self._node)
        holder = f"NeuronUltraServerWorkload {record.workload} (workloadId {record.workload_id})"
        if record.phase != "Bound":
            raise PrepareError(
                f"{ref}: the allocation of {holder} is not complete: node {self._node} is "
                f"{record.phase}; waiting until the operator binds all {record.total_nodes} nodes"
            )
        return placement_from_record(record)
