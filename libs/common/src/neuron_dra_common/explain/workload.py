"""A NeuronUltraServerWorkload's UltraServers: which are whole and healthy, which are partial
and why, and which the workload holds (pure).

An UltraServer can take a unit of the workload (``spec.topologySize`` nodes) when every node
of the unit is Ready and schedulable, publishes its Neuron pool with an UltraServer node
device whose ``ultraserverModes`` list the unit's mode, has no Neuron device tainted or held
by a claim of another workload, and is not allocated to another workload (the
NeuronUltraServer's ``status.allocations``): what the topology allocator and the kubelet
plugin check before the operator writes the workload's claim template.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from neuron_dra_common.driver import DRIVER_NAME, NODE_RESOURCE_TYPE
from neuron_dra_common.explain.model import Device, NodeFacts, Pool, node_from
from neuron_dra_common.explain.nodes import node_reasons, tolerates
from neuron_dra_common.explain.reasons import ORDER, Code
from neuron_dra_common.explain.result import Reason
from neuron_dra_common.topology import UnknownInstanceType, instance_spec
from neuron_dra_common.ultraserver import WORKLOAD_LABEL, modes_for_size

__all__ = ["NodeCheck", "UltraServerCheck", "WorkloadView", "check_workload", "placement_reason"]

Obj = Mapping[str, Any]

#: Units of ``size`` nodes by node-id mask, in the allocator's order of preference.
_UNITS: dict[int, tuple[int, ...]] = {
    4: (0b1111,),
    2: (0b0011, 0b1100, 0b0101, 0b1010),
    1: (0b0001, 0b0010, 0b0100, 0b1000),
}
_BLOCKING = ("NoSchedule", "NoExecute")


class NodeCheck(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    node: str
    node_id: int
    ok: bool
    code: str = ""
    reason: str = ""
    held_by: str = ""


class UltraServerCheck(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    name: str
    #: ``whole`` (every node usable), ``partial`` (some are not), ``held`` (this workload's)
    state: str
    units: int
    nodes: list[NodeCheck]


class WorkloadView(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    instance_type: str
    topology_size: int
    server_count: int
    whole: int
    usable_units: int
    holds: list[str]
    ultra_servers: list[UltraServerCheck]
    pending_pods: list[str] = []


def _attr(device: Device, name: str) -> Any:
    found = device.attribute(f"{DRIVER_NAME}/{name}")
    return found[1] if found else None


def _catalog_name(instance_type: str) -> str:
    # As the topology allocator matches them: trn3pds.48xlarge finds trn3.48xlarge nodes.
    try:
        return instance_spec(instance_type).name
    except UnknownInstanceType:
        return instance_type


def _claim_holders(claims: Sequence[Obj]) -> dict[tuple[str, str], tuple[str, str]]:
    """(pool, device) of the Neuron driver -> (claim ns/name, workload label or "")."""
    out: dict[tuple[str, str], tuple[str, str]] = {}
    for claim in claims:
        meta = claim.get("metadata") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        workload = (meta.get("labels") or {}).get(WORKLOAD_LABEL, "")
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or ():
            if result.get("driver") == DRIVER_NAME:
                out[(result.get("pool", ""), result.get("device", ""))] = (
                    key,
                    f"{meta.get('namespace', '')}/{workload}" if workload else "",
                )
    return out


def _node_check(
    name: str,
    node_id: int,
    *,
    node: NodeFacts | None,
    pool: Pool | None,
    modes_needed: tuple[int, ...],
    workload_key: str,
    allocated_to: str,
    holders: Mapping[tuple[str, str], tuple[str, str]],
    tolerations: Sequence[Obj],
) -> NodeCheck:
    def bad(code: str, reason: str, held_by: str = "") -> NodeCheck:
        return NodeCheck(
            node=name, node_id=node_id, ok=False, code=code, reason=reason, held_by=held_by
        )

    if node is None:
        return bad(Code.NODE_NOT_READY, f"node {name} does not exist")
    if not node.ready:
        return bad(Code.NODE_NOT_READY, f"node {name} is not Ready")
    blocking = node_reasons(node, {"tolerations": list(tolerations)})
    if blocking:
        return bad(blocking[0].code, blocking[0].message)
    if allocated_to and allocated_to != workload_key:
        return bad(Code.DEVICES_HELD, f"allocated to workload {allocated_to}", held_by=allocated_to)
    if pool is None:
        return bad(Code.NO_POOL, f"node {name} publishes no {DRIVER_NAME} ResourceSlice")
    node_device = next(
        (d for d in pool.devices if _attr(d, "resourceType") == NODE_RESOURCE_TYPE), None
    )
    if node_device is None:
        return bad(Code.NO_POOL, f"node {name} publishes no UltraServer node device")
    raw_modes = str(_attr(node_device, "ultraserverModes") or "")
    modes = {int(m) for m in raw_modes.split(",") if m.strip().isdigit()}
    if modes and not modes & set(modes_needed):
        return bad(
            Code.NOT_CONNECTED,
            f"node device lists modes {raw_modes}; "
            f"the workload needs {' or '.join(map(str, modes_needed))}",
        )
    for device in pool.devices:
        holder = holders.get((pool.name, device.name))
        if holder is not None and holder[1] != workload_key:
            return bad(
                Code.DEVICES_HELD,
                f"device {device.name} is held by ResourceClaim {holder[0]}",
                held_by=holder[1] or holder[0],
            )
    for device in pool.devices:
        for taint in device.taints:
            if taint.get("effect") in _BLOCKING and not tolerates(tolerations, taint):
                return bad(
                    Code.DEVICE_TAINTED,
                    f"device {device.name} is tainted {taint.get('key')}="
                    f"{taint.get('value', '')}:{taint.get('effect')}",
                )
    return NodeCheck(node=name, node_id=node_id, ok=True)


def _units(ok_ids: set[int], size: int) -> int:
    mask = sum(1 << i for i in ok_ids)
    count = 0
    for unit in _UNITS.get(size, ()):
        if mask & unit == unit:
            count += 1
            mask &= ~unit
    return count


def check_workload(
    workload: Obj,
    *,
    ultraservers: Sequence[Obj],
    nodes: Sequence[Obj],
    pools: Sequence[Pool],
    claims: Sequence[Obj],
    tolerations: Sequence[Obj] = (),
    pending_pods: Sequence[str] = (),
) -> WorkloadView:
    """Every NeuronUltraServer of the workload's instance type, node by node."""
    meta = workload.get("metadata") or {}
    spec = workload.get("spec") or {}
    key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    instance_type = str(spec.get("instanceType", ""))
    size = int(spec.get("topologySize") or 4)
    needed = modes_for_size(size)
    wanted = _catalog_name(instance_type)
    holds = sorted(
        {
            a.get("ultraServer", "")
            for a in (workload.get("status") or {}).get("allocations") or ()
            if a.get("ultraServer")
        }
    )
    by_node = {f.name: f for f in (node_from(n) for n in nodes)}
    pool_of = {p.node_name: p for p in pools if p.driver == DRIVER_NAME and p.node_name}
    holders = _claim_holders(claims)
    checks: list[UltraServerCheck] = []
    for us in sorted(ultraservers, key=lambda u: (u.get("metadata") or {}).get("name", "")):
        us_name = (us.get("metadata") or {}).get("name", "")
        us_spec = us.get("spec") or {}
        if us_name not in holds and _catalog_name(us_spec.get("instanceType", "")) != wanted:
            continue
        allocated_to = {
            node: a.get("workloadRef", "")
            for a in (us.get("status") or {}).get("allocations") or ()
            for node in a.get("allocatedNodes") or ()
        }
        members = []
        for member in us_spec.get("topology") or ():
            name = member.get("nodeName", "")
            members.append(
                _node_check(
                    name,
                    int(member.get("nodeId", 0)),
                    node=by_node.get(name),
                    pool=pool_of.get(name),
                    modes_needed=needed,
                    workload_key=key,
                    allocated_to=allocated_to.get(name, ""),
                    holders=holders,
                    tolerations=tolerations,
                )
            )
        members.sort(key=lambda c: (c.node_id, c.node))
        complete = len(members) >= 4 and all(c.ok for c in members)
        state = "held" if us_name in holds else "whole" if complete else "partial"
        checks.append(
            UltraServerCheck(
                name=us_name,
                state=state,
                units=_units({c.node_id for c in members if c.ok}, size),
                nodes=members,
            )
        )
    free = [c for c in checks if c.state != "held"]
    return WorkloadView(
        instance_type=instance_type,
        topology_size=size,
        server_count=int(spec.get("serverCount") or 1),
        whole=sum(1 for c in free if c.state == "whole"),
        usable_units=sum(c.units for c in free),
        holds=holds,
        ultra_servers=checks,
        pending_pods=sorted(pending_pods),
    )


def _said(check: NodeCheck) -> str:
    return check.reason if check.node in check.reason else f"{check.node}: {check.reason}"


def placement_reason(view: WorkloadView) -> Reason | None:
    """Why the workload cannot get its UltraServers (``None``: it holds them, or could)."""
    if view.holds or view.usable_units >= view.server_count:
        return None
    codes = [n.code for c in view.ultra_servers for n in c.nodes if not n.ok]
    code = min(codes, key=lambda c: ORDER.get(c, len(ORDER))) if codes else Code.NOT_ENOUGH_DEVICES
    partial = [c for c in view.ultra_servers if c.state == "partial"]
    why = "; ".join(
        f"{c.name}: " + ", ".join(_said(n) for n in c.nodes if not n.ok) for c in partial[:3]
    )
    return Reason(
        code=code,
        message=f"{view.usable_units} of {view.server_count} {view.topology_size}-node units "
        f"free on {len(view.ultra_servers)} {view.instance_type} UltraServers"
        + (f" ({why})" if why else ""),
        subject="ultraservers",
    )
