"""What must hold however the stack is churned and killed (no I/O: the objects come in).

* **No device held twice**: no device is in the allocation of two ResourceClaims; a claim on
  a node's whole-node device (``neuronnode``) holds every device of that node's pool.
* **No UltraServer node held twice**: no node is in the allocations of two
  NeuronUltraServerWorkloads (a deleted one Deallocating is not counted: its nodes go back
  once its claims are gone, before its status does).
* **Every node offers all its devices**: each Neuron node of the fleet has a complete pool
  (every slice of its newest generation) holding ``neurondevice0`` .. ``neurondevice<N-1>`` for
  the N devices of its instance type, and ``neuronnode`` on an UltraServer node.
* **Each node holds a device at most once**: no device is in two claims of a node's kubelet
  plugin checkpoint, nor in two of the node's CDI specs.
* **The allocator's free UltraServers are the fleet minus the held ones**: the topology
  allocator, asked over the bus, finds free exactly the UltraServers none of whose nodes a
  NeuronUltraServerWorkload records, and holds nodes only for workloads that exist.
* **Claims are allocated where they fit**: a workload's pod has its claim allocated; a pod
  asking for N connected devices has its claim allocated unless no node offers N free ones.
* **The audit reconciles** (once the stack converged): no event is written twice, and the
  claims the audit shows prepared (a ``ClaimPrepared`` not followed by a ``ClaimUnprepared``
  on the same node) are exactly the claims of the pods running now, on their nodes.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from neuron_dra_common.driver import DRIVER_NAME, NODE_DEVICE, device_index, device_name
from neuron_dra_common.topology import UnknownInstanceType, instance_spec

__all__ = [
    "INSTANCE_TYPE_LABEL",
    "allocator_mismatches",
    "audit_mismatches",
    "devices_held_twice",
    "free_devices",
    "held_on_node",
    "nodes_held_twice",
    "offered_problems",
    "running_claims",
    "unallocated_claims",
]

INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"

PREPARED = "claim.prepared.v1"
UNPREPARED = "claim.unprepared.v1"

Obj = dict[str, Any]


def _name(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}".lstrip("/")


def devices_held_twice(claims: Iterable[Obj]) -> list[str]:
    """Each device (or whole node) of ours allocated to more than one claim, in words.

    Claims ``default/a`` and ``default/b`` both allocated device ``neurondevice0`` of pool
    ``n1`` give ``['n1/neurondevice0 held by default/a and default/b']``.
    """
    holders: dict[tuple[str, str], set[str]] = defaultdict(set)
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or ():
            if result.get("driver") != DRIVER_NAME or result.get("adminAccess"):
                continue  # another driver's, or a monitor's (admin access holds nothing)
            holders[(str(result.get("pool")), str(result.get("device")))].add(_name(claim))
    problems = [
        f"{pool}/{device} held by {' and '.join(sorted(names))}"
        for (pool, device), names in sorted(holders.items())
        if len(names) > 1
    ]
    for (pool, device), whole in sorted(holders.items()):
        if device != NODE_DEVICE:
            continue
        others = {
            name
            for (p, d), names in holders.items()
            if p == pool and d != NODE_DEVICE
            for name in names
        } - whole
        if others:
            problems.append(
                f"{pool} held whole by {' and '.join(sorted(whole))} and in part by "
                f"{' and '.join(sorted(others))}"
            )
    return problems


def nodes_held_twice(workloads: Iterable[Obj]) -> list[str]:
    """Each UltraServer node in the allocations of more than one workload, in words.

    Workloads ``default/a`` on node ``n1`` and ``default/b`` on ``n1`` and ``n2`` give
    ``['node n1 held by default/a and default/b']``.
    """
    holders: dict[str, set[str]] = defaultdict(set)
    for workload in workloads:
        status = workload.get("status") or {}
        for allocation in status.get("allocations") or ():
            for node in allocation.get("nodes") or ():
                holders[str(node.get("nodeName"))].add(_name(workload))
    return [
        f"node {node} held by {' and '.join(sorted(names))}"
        for node, names in sorted(holders.items())
        if len(names) > 1
    ]


def running_claims(pods: Iterable[Obj], claims: Iterable[Obj]) -> dict[tuple[str, str], str]:
    """(node, claim UID) -> the claim's ``namespace/name``, for every claim of a pod that runs
    (phase Running and not being deleted); ``pods`` and ``claims`` of one namespace."""
    uids = {c["metadata"]["name"]: c["metadata"]["uid"] for c in claims}
    running: dict[tuple[str, str], str] = {}
    for pod in pods:
        status = pod.get("status") or {}
        if status.get("phase") != "Running" or pod["metadata"].get("deletionTimestamp"):
            continue
        for ref in status.get("resourceClaimStatuses") or ():
            name = ref.get("resourceClaimName")
            if name in uids:
                namespace = pod["metadata"].get("namespace", "")
                running[(pod["spec"]["nodeName"], uids[name])] = f"{namespace}/{name}"
    return running


def audit_mismatches(
    lines: Iterable[Obj], running: Mapping[tuple[str, str], str], *, namespace: str
) -> list[str]:
    """How the audit (its CloudEvents, in the order written) differs from the claims prepared
    now, in words. ``running`` maps (node, claim UID) to the claim's ``namespace/name`` for
    every running pod's claim in ``namespace``; only claims of ``namespace`` are compared.

    A pod ``chaos/p1`` running on ``n1`` with claim UID ``u1`` and an audit holding only
    ``ClaimPrepared`` of ``u1`` on ``n1`` give ``[]``; without that event, ``['claim chaos/p1-c
    (u1) runs on n1 but the audit never showed it prepared there']``.
    """
    problems: list[str] = []
    seen: set[str] = set()
    prepared: dict[tuple[str, str], str] = {}
    for line in lines:
        ident = str(line.get("id", ""))
        if ident in seen:
            problems.append(f"event {ident} written twice")
        seen.add(ident)
        data = line.get("data") or {}
        kind = data.get("type")
        claim = data.get("claim") or {}
        if kind not in (PREPARED, UNPREPARED) or claim.get("namespace") != namespace:
            continue
        key = (str(data.get("node")), str(claim.get("uid")))
        if kind == PREPARED:
            prepared[key] = f"{claim.get('namespace')}/{claim.get('name')}"
        else:
            prepared.pop(key, None)
    for (node, uid), name in sorted(running.items()):
        if (node, uid) not in prepared:
            problems.append(
                f"claim {name} ({uid}) runs on {node} but the audit never showed it prepared there"
            )
    for (node, uid), name in sorted(prepared.items()):
        if (node, uid) not in running:
            problems.append(
                f"claim {name} ({uid}) is prepared on {node} by the audit, but no pod of it runs"
            )
    return problems


def _newest_pools(slices: Iterable[Obj]) -> dict[str, tuple[int, int, list[Obj]]]:
    """Pool name -> (newest generation, slices it should have, its slices of that generation)."""
    pools: dict[str, tuple[int, int, list[Obj]]] = {}
    for piece in slices:
        spec = piece.get("spec") or {}
        if spec.get("driver") != DRIVER_NAME:
            continue
        pool = spec.get("pool") or {}
        name, generation = str(pool.get("name")), int(pool.get("generation") or 0)
        have = pools.get(name)
        if have is None or generation > have[0]:
            pools[name] = (generation, int(pool.get("resourceSliceCount") or 1), [piece])
        elif generation == have[0]:
            have[2].append(piece)
    return pools


def leftover_taints(slices: Iterable[Obj]) -> list[str]:
    """Each device taint still on a published device, in words (``node/device still
    tainted key:effect``)."""
    return [
        f"{piece['spec'].get('nodeName') or piece['spec']['pool']['name']}/"
        f"{device['name']} still tainted {taint['key']}:{taint['effect']}"
        for piece in slices
        for device in (piece.get("spec") or {}).get("devices") or ()
        for taint in device.get("taints") or ()
    ]


def offered_problems(nodes: Iterable[Obj], slices: Iterable[Obj]) -> list[str]:
    """Each Neuron node whose pool is missing, incomplete or short of a device, in words.

    A node's devices are those of its instance type (``node.kubernetes.io/instance-type``):
    ``neurondevice0`` .. ``neurondevice<N-1>``, and ``neuronnode`` on an UltraServer node.
    Nodes of other instance types are not ours and are skipped. A trn2.48xlarge node ``n1``
    with no slice gives ``['node n1 offers no ResourceSlice pool (16 devices expected)']``.
    One pass over nodes and slices: linear in the fleet.
    """
    pools = _newest_pools(slices)
    problems: list[str] = []
    for node in sorted(nodes, key=lambda n: str(n["metadata"]["name"])):
        name = str(node["metadata"]["name"])
        itype = (node["metadata"].get("labels") or {}).get(INSTANCE_TYPE_LABEL, "")
        try:
            spec = instance_spec(itype)
        except UnknownInstanceType:
            continue
        expected = [device_name(i) for i in range(spec.devices)]
        if spec.ultraserver_nodes > 1:
            expected.append(NODE_DEVICE)
        pool = pools.get(name)
        if pool is None:
            problems.append(
                f"node {name} offers no ResourceSlice pool ({len(expected)} devices expected)"
            )
            continue
        generation, count, pieces = pool
        if len(pieces) < count:
            problems.append(
                f"node {name}'s pool is incomplete: {len(pieces)} of {count} slices of "
                f"generation {generation}"
            )
        offered = {
            str(d.get("name")) for p in pieces for d in (p.get("spec") or {}).get("devices") or ()
        }
        problems += [
            f"node {name} does not offer device {device}"
            for device in expected
            if device not in offered
        ]
    return problems


def held_on_node(
    node: str, checkpoint: Mapping[str, Iterable[str]], specs: Mapping[str, Iterable[str]]
) -> list[str]:
    """Each device a node holds more than once, in words.

    ``checkpoint`` maps each claim UID in the node's kubelet plugin checkpoint to its devices
    (``neurondevice3``); ``specs`` maps each claim UID with a CDI spec on the node to the host
    device nodes the spec injects (``/dev/neuron3``). Claims ``u1`` and ``u2`` both holding
    ``neurondevice3`` in the checkpoint of ``n1`` give ``['node n1: checkpoint holds
    neurondevice3 in 2 claims (u1, u2)']``.
    """
    problems: list[str] = []
    for what, held in (("checkpoint holds", checkpoint), ("CDI specs hold", specs)):
        holders: dict[str, set[str]] = defaultdict(set)
        for uid, devices in held.items():
            for device in devices:
                holders[device].add(uid)
        problems += [
            f"node {node}: {what} {device} in {len(uids)} claims ({', '.join(sorted(uids))})"
            for device, uids in sorted(holders.items())
            if len(uids) > 1
        ]
    return problems


_AVAILABLE = re.compile(r"units, (\d+) available")


def allocator_mismatches(
    ultraservers: Mapping[str, Iterable[str]],
    workloads: Iterable[Obj],
    *,
    granted: bool,
    reason: str,
    refusals: Iterable[tuple[str, str, Iterable[str]]],
) -> list[str]:
    """How the allocator's view differs from the workloads', in words.

    ``ultraservers`` maps each UltraServer of the fleet to its nodes; ``workloads`` are every
    NeuronUltraServerWorkload. The rest is the allocator's answer to a request for one more
    whole UltraServer than the fleet has (which it can never grant): ``reason`` says how many
    whole UltraServers it found free, ``refusals`` (UltraServer, code, holders) why it could not
    take the others. Free must be exactly the UltraServers no workload holds a node of, and
    every holder the allocator names must be a workload that records nodes there.
    """
    held: dict[str, set[str]] = defaultdict(set)  # UltraServer -> workloads holding a node
    where = {node: us for us, nodes in ultraservers.items() for node in nodes}
    for workload in workloads:
        for allocation in (workload.get("status") or {}).get("allocations") or ():
            for node in allocation.get("nodes") or ():
                us = where.get(str(node.get("nodeName")))
                if us is not None:
                    held[us].add(_name(workload))
    if granted:
        return [
            f"allocator granted {len(ultraservers) + 1} whole UltraServers of a fleet of "
            f"{len(ultraservers)}"
        ]
    found = _AVAILABLE.search(reason)
    if found is None:
        return [f"allocator's refusal does not say how many UltraServers are free: {reason}"]
    free, expected = int(found.group(1)), len(ultraservers) - len(held)
    problems = []
    if free != expected:
        taken = ", ".join(sorted(held)) or "none"
        problems.append(
            f"allocator has {free} whole UltraServers free, the fleet minus the held ones is "
            f"{expected} (held: {taken})"
        )
    for us, code, holders in refusals:
        if code != "taken":
            continue
        ghosts = sorted(set(holders) - held.get(us, set()))
        if ghosts:
            problems.append(
                f"allocator holds nodes of {us} for {', '.join(ghosts)}, which no "
                "NeuronUltraServerWorkload records there"
            )
        elif us not in held:
            problems.append(f"allocator holds nodes of {us}, which no workload holds")
    return problems


def _results(claim: Obj) -> list[Obj]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return [
        r
        for r in (allocation.get("devices") or {}).get("results") or ()
        if r.get("driver") == DRIVER_NAME and not r.get("adminAccess")
    ]


def free_devices(
    nodes: Iterable[Obj], slices: Iterable[Obj], claims: Iterable[Obj]
) -> dict[str, set[int]]:
    """Node -> indexes of the Neuron devices it offers untainted and no claim holds."""
    pools = _newest_pools(slices)
    taken: dict[str, set[str]] = defaultdict(set)
    for claim in claims:
        for result in _results(claim):
            taken[str(result.get("pool"))].add(str(result.get("device")))
    free: dict[str, set[int]] = {}
    for node in nodes:
        name = str(node["metadata"]["name"])
        pool = pools.get(name)
        if pool is None or NODE_DEVICE in taken[name]:
            free[name] = set()
            continue
        free[name] = {
            index
            for p in pool[2]
            for d in (p.get("spec") or {}).get("devices") or ()
            if not d.get("taints")
            and (index := device_index(str(d.get("name")))) is not None
            and d.get("name") not in taken[name]
        }
    return free


def _fits(free: set[int], count: int) -> list[int] | None:
    """The first group of ``count`` connected devices (a torus row, two rows, the node) that is
    all free; for 1, any free device."""
    if count == 1:
        return [min(free)] if free else None
    for start in range(0, max(free, default=-1) + 1, count):
        group = list(range(start, start + count))
        if free.issuperset(group):
            return group
    return None


def unallocated_claims(
    pods: Iterable[Obj],
    claims: Iterable[Obj],
    free: Mapping[str, set[int]],
    *,
    counts: Mapping[str, int],
) -> list[str]:
    """Each pod whose claim is not allocated though it should be, in words.

    ``counts`` maps a churn claim template to the connected devices it asks for; such a claim
    may wait only while no node in ``free`` (node -> free device indexes, of the nodes its pods
    may use) has that many connected devices free. Any other claim (a workload's) must be
    allocated. A pod being deleted is skipped.
    """
    by_name = {c["metadata"]["name"]: c for c in claims}
    # Where each size fits first, found once per size: linear in the nodes, whatever the pods.
    room: dict[int, tuple[str, list[int]] | None] = {}
    problems = []
    for pod in sorted(pods, key=lambda p: str(p["metadata"]["name"])):
        if pod["metadata"].get("deletionTimestamp"):
            continue
        name = pod["metadata"]["name"]
        refs = {
            r.get("name"): r.get("resourceClaimName")
            for r in (pod.get("status") or {}).get("resourceClaimStatuses") or ()
        }
        for ref in (pod.get("spec") or {}).get("resourceClaims") or ():
            claim = by_name.get(refs.get(ref.get("name")) or "")
            if claim is None:
                problems.append(f"pod {name} has no ResourceClaim for {ref.get('name')} yet")
                continue
            if (claim.get("status") or {}).get("allocation"):
                continue
            count = counts.get(str(ref.get("resourceClaimTemplateName")))
            if count is None:
                problems.append(f"pod {name}'s claim {claim['metadata']['name']} is not allocated")
                continue
            if count not in room:
                room[count] = next(
                    (
                        (node, group)
                        for node, devices in sorted(free.items())
                        if (group := _fits(devices, count))
                    ),
                    None,
                )
            fits = room[count]
            if fits is not None:
                node, group = fits
                problems.append(
                    f"pod {name}'s claim {claim['metadata']['name']} ({count} devices) is not "
                    f"allocated though node {node} has devices {group[0]}-{group[-1]} free"
                )
    return problems
