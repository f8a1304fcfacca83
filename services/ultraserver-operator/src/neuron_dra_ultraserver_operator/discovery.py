"""UltraServers from Nodes and ResourceSlices (no I/O).

A node belongs to the UltraServer its ``neuron_node`` device names (``ultraserverId``,
``ultraserverNodeId``, ``ultraserverModes``: what the scheduler sees); where the slice
publisher has not written it yet, the node's AWS labels say the same
(``neuron.amazonaws.com/ultraserver-server-id-4``, ``...-node-id-4``, ``...-mode``). A member
is healthy when its Node is Ready.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec
from neuron_dra_common.driver import DRIVER_NAME, NODE_RESOURCE_TYPE
from neuron_dra_common.ultraserver import (
    CAPACITY_BLOCK_LABEL,
    MODE_LABEL,
    NODE_ID_4_LABEL,
    SERVER_ID_2_LABEL,
    SERVER_ID_4_LABEL,
    modes_for_size,
    ultraserver_name,
)

__all__ = [
    "DRIVER",
    "Identity",
    "Member",
    "UltraServerView",
    "discover",
    "node_devices_only",
    "slice_identities",
]

DRIVER = DRIVER_NAME
_INSTANCE_LABEL = "node.kubernetes.io/instance-type"

Obj = dict[str, Any]


class Member(msgspec.Struct, frozen=True, kw_only=True):
    node_name: str
    node_id: int
    server_id_2: str = ""
    modes: tuple[int, ...] = ()
    healthy: bool = True
    reason: str = ""
    #: ``ultraserverId`` / ``ultraserverNodeId`` of the node's neuron_node device as published
    #: (from the labels until the slice exists: the slice publisher falls back to them too).
    device_server_id: str = ""
    device_node_id: int | None = None


class UltraServerView(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    server_id: str
    instance_type: str
    capacity_block_id: str = ""
    members: tuple[Member, ...] = ()

    @property
    def modes(self) -> tuple[int, ...]:
        listed = [set(m.modes) for m in self.members if m.modes]
        return tuple(sorted(set.intersection(*listed))) if listed else ()


def _attr(device: Mapping[str, Any], name: str) -> Any:
    value = (device.get("attributes") or {}).get(name) or {}
    for kind in ("string", "int", "bool", "version"):
        if kind in value:
            return value[kind]
    return None


#: (ultraserverId, ultraserverNodeId, modes) of a node's neuron_node device
Identity = tuple[str, int | None, tuple[int, ...]]


def slice_identities(slices: Iterable[Obj]) -> dict[str, Identity]:
    """Node -> (ultraserverId, ultraserverNodeId, modes) of its neuron_node device."""
    out: dict[str, Identity] = {}
    for s in slices:
        spec = s.get("spec") or {}
        if spec.get("driver") != DRIVER or not spec.get("nodeName"):
            continue
        for device in spec.get("devices") or ():
            if _attr(device, "resourceType") != NODE_RESOURCE_TYPE:
                continue
            server = _attr(device, "ultraserverId")
            if not server:
                continue
            node_id = _attr(device, "ultraserverNodeId")
            raw_modes = str(_attr(device, "ultraserverModes") or "")
            modes = tuple(sorted({int(m) for m in raw_modes.split(",") if m.strip().isdigit()}))
            out[spec["nodeName"]] = (
                str(server),
                int(node_id) if isinstance(node_id, int) else None,
                modes,
            )
    return out


def node_devices_only(obj: Obj) -> Obj:
    """What the operator keeps of a ResourceSlice (its informer's transform): the metadata
    the informer needs, the driver, the node and the ``neuron_node`` devices; the chips
    (16 of a node's 17 devices, most of a slice's size) are never read here."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    kept = {k: meta[k] for k in ("name", "uid", "resourceVersion") if k in meta}
    devices = [
        d for d in spec.get("devices") or () if _attr(d, "resourceType") == NODE_RESOURCE_TYPE
    ]
    return {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "metadata": kept,
        "spec": {
            "driver": spec.get("driver"),
            "nodeName": spec.get("nodeName"),
            "devices": devices,
        },
    }


def _label_modes(value: str) -> tuple[int, ...]:
    # AWS's label lists node counts ("1_2_4"); the driver's enums are what the rest uses.
    sizes = [int(p) for p in value.split("_") if p.isdigit()]
    return tuple(sorted({m for s in sizes for m in modes_for_size(s)}))


def _ready(node: Obj) -> tuple[bool, str]:
    for cond in (node.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "Ready":
            if cond.get("status") == "True":
                return True, ""
            return False, f"NotReady: {cond.get('reason') or cond.get('status')}"
    return False, "NotReady: no Ready condition yet"


def discover(
    nodes: Iterable[Obj],
    slices: Iterable[Obj] = (),
    *,
    identities: Mapping[str, Identity] | None = None,
) -> dict[str, UltraServerView]:
    """Every UltraServer with at least one member, by NeuronUltraServer name.

    The devices' identities come from ``slices``, or ready-made from ``identities``.
    """
    if identities is None:
        identities = slice_identities(slices)
    groups: dict[str, dict[str, Any]] = {}
    for node in nodes:
        meta = node.get("metadata") or {}
        name = meta.get("name") or ""
        labels = meta.get("labels") or {}
        device = identities.get(name)
        server = (device[0] if device else "") or labels.get(SERVER_ID_4_LABEL, "")
        node_id: int | None = device[1] if device else None
        if node_id is None and labels.get(NODE_ID_4_LABEL, "").isdigit():
            node_id = int(labels[NODE_ID_4_LABEL])
        if not server or set(server) == {"0"} or node_id is None or not 0 <= node_id <= 3:
            continue
        healthy, reason = _ready(node)
        modes = (device[2] if device else ()) or _label_modes(labels.get(MODE_LABEL, ""))
        member = Member(
            node_name=name,
            node_id=node_id,
            server_id_2=labels.get(SERVER_ID_2_LABEL, ""),
            modes=modes,
            healthy=healthy,
            reason=reason,
            device_server_id=server,
            device_node_id=node_id,
        )
        us_name = ultraserver_name(server)
        group = groups.setdefault(
            us_name,
            {
                "server": server,
                "itype": labels.get(_INSTANCE_LABEL, ""),
                "block": labels.get(CAPACITY_BLOCK_LABEL, ""),
                "members": [],
            },
        )
        group["members"].append(member)
    return {
        name: UltraServerView(
            name=name,
            server_id=g["server"],
            instance_type=g["itype"],
            capacity_block_id=g["block"],
            members=tuple(sorted(g["members"], key=lambda m: (m.node_id, m.node_name))),
        )
        for name, g in sorted(groups.items())
    }
