"""Whole-node UltraServer placement: ``count`` units of ``size`` nodes, all or nothing (no I/O).

A unit is a set of nodes of one UltraServer the driver can run as one mode:

- 4 nodes: all of node ids {0, 1, 2, 3} (mode 1);
- 2 nodes: the vertical pairs {0, 1}, {2, 3} (mode 3), then the horizontal pairs {0, 2},
  {1, 3} (mode 2);
- 1 node: any node (mode 4).

A unit is usable when every node in it is known, healthy, free, and lists the unit's mode
(a node that lists no modes is taken to support all of them).

Best fit keeps whole UltraServers free for large requests: each unit takes the preferred
mode (vertical pairs before horizontal), then goes where the fewest free nodes remain
afterwards, then where the fewest free vertical pairs are broken, then to the lowest
UltraServer id, so the answer depends only on the
fleet's state, never on the order events arrived in. UltraServers are kept in buckets by
(instance type, free mask, modes), so a decision looks at a few dozen buckets, not at every
UltraServer. First fit (the benchmark's baseline) walks UltraServers by id and takes the
first usable units.
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

import msgspec
from neuron_dra_common.events import UltraServerGrant, UltraServerRefusal
from neuron_dra_common.topology import UnknownInstanceType, instance_spec
from neuron_dra_common.ultraserver import (
    MODE_FOUR_NODE,
    MODE_SINGLE_NODE,
    MODE_TWO_NODE_HORIZONTAL,
    MODE_TWO_NODE_VERTICAL,
    TOPOLOGY_SIZES,
)

__all__ = [
    "ALL_MODES",
    "UNITS",
    "Allocation",
    "Decision",
    "Fleet",
    "PlacementError",
    "Request",
    "Strategy",
]

ALL_MODES: Final = (MODE_FOUR_NODE, MODE_TWO_NODE_HORIZONTAL, MODE_TWO_NODE_VERTICAL, 4)
#: Units per size, preferred first: (node-id mask, mode).
UNITS: Final[dict[int, tuple[tuple[int, int], ...]]] = {
    4: ((0b1111, MODE_FOUR_NODE),),
    2: (
        (0b0011, MODE_TWO_NODE_VERTICAL),
        (0b1100, MODE_TWO_NODE_VERTICAL),
        (0b0101, MODE_TWO_NODE_HORIZONTAL),
        (0b1010, MODE_TWO_NODE_HORIZONTAL),
    ),
    1: tuple((1 << i, MODE_SINGLE_NODE) for i in range(4)),
}
_VERTICAL_PAIRS: Final = (0b0011, 0b1100)
_MAX_REFUSALS: Final = 16
_MAX_EXAMINED: Final = 256


class PlacementError(ValueError):
    """A request or fleet change that cannot be applied; the message names the field."""


class Strategy(enum.StrEnum):
    BEST_FIT = "best-fit"
    FIRST_FIT = "first-fit"


def catalog_name(instance_type: str) -> str:
    """The catalog's name of an instance type, so that its other names match it (a workload
    written for ``trn3pds.48xlarge`` or ``Trn3pds`` finds ``trn3.48xlarge`` nodes and the other
    way round); a name the catalog does not know is kept as given.

    >>> catalog_name("Trn3pds")
    'trn3.48xlarge'
    """
    try:
        return instance_spec(instance_type).name
    except UnknownInstanceType:
        return instance_type


class Request(msgspec.Struct, frozen=True, kw_only=True):
    """``count`` units of ``size`` nodes for workload ``workload`` (``ns/name``)."""

    workload: str
    uid: str
    size: int
    count: int = 1
    instance_type: str = ""
    generation: int = 0
    exclude: frozenset[str] = frozenset()


class Allocation(msgspec.Struct, frozen=True, kw_only=True):
    """What a workload holds."""

    workload: str
    uid: str
    generation: int
    size: int
    grants: tuple[UltraServerGrant, ...]

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(n for g in self.grants for n in g.nodes)


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """A grant (``allocation`` set) or a refusal with the reason, per UltraServer."""

    granted: bool
    allocation: Allocation | None = None
    reason: str = ""
    refusals: tuple[UltraServerRefusal, ...] = ()


@dataclass
class _Node:
    name: str
    node_id: int
    modes: tuple[int, ...]
    server_id_2: str
    healthy: bool = True
    reason: str = ""


@dataclass
class _UltraServer:
    id: str
    instance_type: str
    #: the driver's id of the whole UltraServer (trn2u ``server_id_4``, Trn3 ``reservation_id``)
    server_id: str = ""
    nodes: dict[int, _Node] = field(default_factory=dict)
    key: tuple[str, int, tuple[int, ...]] | None = None

    def modes(self) -> tuple[int, ...]:
        listed = [n.modes for n in self.nodes.values() if n.modes]
        if not listed:
            return ALL_MODES
        return tuple(sorted(set.intersection(*(set(m) for m in listed))))


def _bits(mask: int) -> list[int]:
    return [i for i in range(4) if mask >> i & 1]


def _score(free: int, unit: int, mode: int, rank: int) -> tuple[int, int, int, int]:
    # The preferred mode first (vertical pairs before horizontal), then what stays free.
    pref = 1 if mode == MODE_TWO_NODE_HORIZONTAL else 0
    after = free & ~unit
    broken = sum(1 for p in _VERTICAL_PAIRS if free & p == p and after & p != p)
    return (pref, after.bit_count(), broken, rank)


class Fleet:
    """The UltraServers, their nodes' health, and who holds which node.

    >>> fleet = Fleet()
    >>> for i in range(4):
    ...     fleet.upsert_node(f"n{i}", ultraserver="us-a", instance_type="trn2u.48xlarge",
    ...                       node_id=i)
    >>> fleet.place(Request(workload="ml/train", uid="u1", size=2)).allocation.nodes
    ('n0', 'n1')
    """

    def __init__(self) -> None:
        self._servers: dict[str, _UltraServer] = {}
        self._node_server: dict[str, str] = {}
        self._holder: dict[str, str] = {}  # node -> uid
        self._allocations: dict[str, Allocation] = {}
        self._buckets: dict[tuple[str, int, tuple[int, ...]], list[str]] = {}
        self._ids: list[str] = []  # sorted, for first fit

    # --- fleet changes -------------------------------------------------------------------

    def upsert_node(
        self,
        name: str,
        *,
        ultraserver: str,
        instance_type: str,
        node_id: int,
        modes: Iterable[int] = (),
        server_id_2: str = "",
        server_id: str = "",
    ) -> None:
        """Add a node or update where it sits; its health is kept. ``server_id`` is the
        driver's id of the whole UltraServer, ``server_id_2`` of the node's vertical pair."""
        if not 0 <= node_id <= 3:
            raise PlacementError(f"Node {name}: node_id_4 {node_id} is not one of 0, 1, 2, 3")
        old = self._node_server.get(name)
        healthy, reason = True, ""
        if old is not None:
            prev = self._find(name)
            healthy, reason = prev.healthy, prev.reason
            if old != ultraserver or prev.node_id != node_id:
                self.remove_node(name)
        us = self._servers.get(ultraserver)
        if us is None:
            us = _UltraServer(id=ultraserver, instance_type=catalog_name(instance_type))
            self._servers[ultraserver] = us
            bisect.insort(self._ids, ultraserver)
        other = us.nodes.get(node_id)
        if other is not None and other.name != name:
            raise PlacementError(
                f"Node {name}: UltraServer {ultraserver} node id {node_id} is already "
                f"node {other.name}"
            )
        us.instance_type = catalog_name(instance_type)
        us.server_id = server_id or us.server_id
        us.nodes[node_id] = _Node(
            name, node_id, tuple(sorted(set(modes))), server_id_2, healthy, reason
        )
        self._node_server[name] = ultraserver
        self._rebucket(us)

    def remove_node(self, name: str) -> None:
        """Forget a node (it left the fleet); an allocation that holds it keeps its name."""
        server = self._node_server.pop(name, None)
        if server is None:
            return
        us = self._servers[server]
        us.nodes = {i: n for i, n in us.nodes.items() if n.name != name}
        self._rebucket(us)

    def set_health(self, name: str, *, healthy: bool, reason: str = "") -> None:
        """Mark a node healthy or not; unknown nodes are ignored."""
        if name not in self._node_server:
            return
        node = self._find(name)
        node.healthy, node.reason = healthy, reason
        self._rebucket(self._servers[self._node_server[name]])

    def server_id(self, ultraserver: str, *, size: int, first: str = "") -> str:
        """What ``NEURON_RT_ULTRASERVER_SERVER_ID`` carries for a ``size``-node unit of
        ``ultraserver`` whose first node is ``first``: the driver's server id for that size
        (a pair's ``server_id_2``, else the whole UltraServer's), or the UltraServer's name
        where the driver's id is not known."""
        us = self._servers.get(ultraserver)
        if us is None:
            return ultraserver
        pair = ""
        if size == 2 and first in self._node_server:
            pair = self._find(first).server_id_2
        return pair or us.server_id or ultraserver

    def _find(self, name: str) -> _Node:
        us = self._servers[self._node_server[name]]
        return next(n for n in us.nodes.values() if n.name == name)

    def _free_mask(self, us: _UltraServer) -> int:
        mask = 0
        for i, node in us.nodes.items():
            if node.healthy and node.name not in self._holder:
                mask |= 1 << i
        return mask

    def _rebucket(self, us: _UltraServer) -> None:
        if us.key is not None:
            bucket = self._buckets[us.key]
            del bucket[bisect.bisect_left(bucket, us.id)]
            if not bucket:
                del self._buckets[us.key]
        us.key = (us.instance_type, self._free_mask(us), us.modes())
        bisect.insort(self._buckets.setdefault(us.key, []), us.id)

    # --- queries ---------------------------------------------------------------------------

    @property
    def ultraservers(self) -> tuple[str, ...]:
        return tuple(self._ids)

    def allocation(self, uid: str) -> Allocation | None:
        return self._allocations.get(uid)

    def allocations(self) -> tuple[Allocation, ...]:
        return tuple(self._allocations[uid] for uid in sorted(self._allocations))

    def position(self, node: str) -> tuple[str, int] | None:
        """The UltraServer and node id of ``node``, if it is known."""
        server = self._node_server.get(node)
        return None if server is None else (server, self._find(node).node_id)

    def holder(self, node: str) -> str | None:
        """The UID of the workload holding ``node``."""
        return self._holder.get(node)

    def free_nodes(self) -> int:
        return sum(self._free_mask(us).bit_count() for us in self._servers.values())

    # --- placement ---------------------------------------------------------------------------

    def place(self, request: Request, *, strategy: Strategy = Strategy.BEST_FIT) -> Decision:
        """Grant ``request`` whole or refuse it; a workload already holding nodes keeps them."""
        if request.size not in TOPOLOGY_SIZES:
            raise PlacementError(
                f"NeuronUltraServerWorkload {request.workload}: spec.topologySize "
                f"{request.size} is not one of 1, 2, 4"
            )
        if request.count < 1:
            raise PlacementError(
                f"NeuronUltraServerWorkload {request.workload}: spec.serverCount "
                f"{request.count} must be at least 1"
            )
        held = self._allocations.get(request.uid)
        if held is not None:
            return Decision(granted=True, allocation=held)
        if request.instance_type:
            request = msgspec.structs.replace(
                request, instance_type=catalog_name(request.instance_type)
            )
        pick = self._best_fit if strategy is Strategy.BEST_FIT else self._first_fit
        chosen = pick(request)
        if len(chosen) < request.count:
            return self._refuse(request, found=len(chosen))
        grants = []
        for index, (us_id, unit, mode) in enumerate(chosen):
            us = self._servers[us_id]
            members = [us.nodes[i] for i in _bits(unit)]
            grants.append(
                UltraServerGrant(
                    ultraserver=us_id,
                    index=index,
                    nodes=tuple(n.name for n in members),
                    node_ids=tuple(n.node_id for n in members),
                    mode=mode,
                    server_id=self.server_id(us_id, size=request.size, first=members[0].name),
                )
            )
        return Decision(granted=True, allocation=self._record(request, tuple(grants)))

    def _record(self, request: Request, grants: tuple[UltraServerGrant, ...]) -> Allocation:
        allocation = Allocation(
            workload=request.workload,
            uid=request.uid,
            generation=request.generation,
            size=request.size,
            grants=grants,
        )
        self._allocations[request.uid] = allocation
        for grant in grants:
            for node in grant.nodes:
                self._holder[node] = request.uid
        self._rebucket_holding(allocation)
        return allocation

    def _rebucket_holding(self, allocation: Allocation) -> None:
        # Where the nodes sit, not only what the grants say: a recorded grant may name nodes
        # of another UltraServer, whose free nodes must not be offered again.
        touched = {g.ultraserver for g in allocation.grants}
        touched.update(self._node_server[n] for n in allocation.nodes if n in self._node_server)
        for us_id in sorted(touched):
            if us_id in self._servers:
                self._rebucket(self._servers[us_id])

    def _best_fit(self, request: Request) -> list[tuple[str, int, int]]:
        chosen: list[tuple[str, int, int]] = []
        taken: dict[str, int] = {}  # us -> mask taken by this request so far
        for _ in range(request.count):
            best: tuple[tuple[int, int, int, int], str, int, int] | None = None
            for (itype, mask, modes), ids in self._buckets.items():
                if request.instance_type and itype != request.instance_type:
                    continue
                if not any(mask & u == u and m in modes for u, m in UNITS[request.size]):
                    continue
                for us_id in ids:
                    if us_id in request.exclude:
                        continue
                    free = mask & ~taken.get(us_id, 0)
                    scored = [
                        (_score(free, unit, mode, rank), unit, mode)
                        for rank, (unit, mode) in enumerate(UNITS[request.size])
                        if free & unit == unit and mode in modes
                    ]
                    if not scored:
                        continue
                    score, unit, mode = min(scored)
                    if best is None or (score, us_id) < (best[0], best[1]):
                        best = (score, us_id, unit, mode)
                    # Ids are sorted and only this request's picks lower a bucket's score, so
                    # the first untouched id is the bucket's best.
                    if us_id not in taken:
                        break
            if best is None:
                break
            _, us_id, unit, mode = best
            taken[us_id] = taken.get(us_id, 0) | unit
            chosen.append((us_id, unit, mode))
        return chosen

    def _first_fit(self, request: Request) -> list[tuple[str, int, int]]:
        chosen: list[tuple[str, int, int]] = []
        for us_id in self._ids:
            us = self._servers[us_id]
            if us_id in request.exclude or (
                request.instance_type and us.instance_type != request.instance_type
            ):
                continue
            free, modes = self._free_mask(us), us.modes()
            for unit, mode in UNITS[request.size]:
                if free & unit == unit and mode in modes:
                    chosen.append((us_id, unit, mode))
                    free &= ~unit
                    if len(chosen) == request.count:
                        return chosen
        return chosen

    def _refuse(self, request: Request, *, found: int) -> Decision:
        # Explaining is O(UltraServers); a refusal at fleet scale must stay cheap, so only the
        # first ones (by id) are examined and the rest are counted.
        refusals: list[UltraServerRefusal] = []
        examined = 0
        for us_id in self._ids:
            if examined == _MAX_EXAMINED:
                break
            examined += 1
            if (r := self._why(us_id, request)) is not None:
                refusals.append(r)
        unexamined = len(self._ids) - examined
        wanted = f"{request.count} x {request.size}-node"
        itype = f" {request.instance_type}" if request.instance_type else ""
        counts: dict[str, int] = {}
        for r in refusals:
            counts[r.code] = counts.get(r.code, 0) + 1
        summary = ", ".join(f"{n} {code}" for code, n in sorted(counts.items()))
        if not self._ids:
            summary = "no UltraServer is known"
        details = "; ".join(f"{r.ultraserver}: {r.detail}" for r in refusals[:_MAX_REFUSALS])
        more = len(refusals) - _MAX_REFUSALS
        reason = (
            f"needs {wanted}{itype} units, {found} available ({summary})"
            + (f": {details}" if details else "")
            + (f"; and {more} more UltraServers" if more > 0 else "")
            + (f"; {unexamined} more UltraServers not examined" if unexamined > 0 else "")
        )
        return Decision(granted=False, reason=reason, refusals=tuple(refusals[:_MAX_REFUSALS]))

    def _why(self, us_id: str, request: Request) -> UltraServerRefusal | None:
        us = self._servers[us_id]
        if request.instance_type and us.instance_type != request.instance_type:
            return None  # not a candidate at all; counted in the summary as absent
        if us_id in request.exclude:
            return UltraServerRefusal(ultraserver=us_id, code="excluded", detail="excluded")
        healthy = {i for i, n in us.nodes.items() if n.healthy}
        healthy_mask = sum(1 << i for i in healthy)
        units = UNITS[request.size]
        shaped = [(u, m) for u, m in units if healthy_mask & u == u]
        if not shaped:
            sick = ", ".join(
                f"{n.name} {n.reason or 'unhealthy'}" for n in us.nodes.values() if not n.healthy
            )
            detail = f"too few healthy nodes ({len(healthy)} of {len(us.nodes)} known healthy"
            detail += f": {sick})" if sick else ")"
            return UltraServerRefusal(
                ultraserver=us_id, code="too-few-healthy-nodes", detail=detail
            )
        modes = us.modes()
        free = self._free_mask(us)
        if any(free & u == u and m in modes for u, m in units):
            return None  # it could take a unit: not why the request failed
        if not any(m in modes for _, m in shaped):
            listed = ", ".join(str(m) for m in modes) or "none"
            return UltraServerRefusal(
                ultraserver=us_id,
                code="mode-not-supported",
                detail=f"{request.size}-node mode not supported (modes {listed})",
            )
        holders = sorted(
            {
                self._allocations[self._holder[n.name]].workload
                for n in us.nodes.values()
                if n.name in self._holder and self._holder[n.name] in self._allocations
            }
        )
        by = f", the rest taken by workload {', '.join(holders)}" if holders else ""
        return UltraServerRefusal(
            ultraserver=us_id,
            code="taken",
            detail=f"{free.bit_count()} of {len(us.nodes)} nodes free{by}",
            holders=tuple(holders),
        )

    # --- release and adoption ---------------------------------------------------------------

    def release(self, uid: str) -> Allocation | None:
        """Give back everything ``uid`` holds; returns what it held (``None``: nothing)."""
        allocation = self._allocations.pop(uid, None)
        if allocation is None:
            return None
        for node in allocation.nodes:
            if self._holder.get(node) == uid:
                del self._holder[node]
        self._rebucket_holding(allocation)
        return allocation

    def adopt(self, request: Request, grants: tuple[UltraServerGrant, ...]) -> Decision:
        """Record an allocation made earlier (replayed, or recorded in the CRs).

        Refused when a node is held by another workload; nodes of unknown or unhealthy
        UltraServers are kept, because the workload is already running there.
        """
        held = self._allocations.get(request.uid)
        if held is not None:
            return Decision(granted=True, allocation=held)
        for grant in grants:
            for node in grant.nodes:
                other = self._holder.get(node)
                if other is not None and other != request.uid:
                    owner = self._allocations[other].workload
                    return Decision(
                        granted=False,
                        reason=f"node {node} of {grant.ultraserver} is taken by workload {owner}",
                        refusals=(
                            UltraServerRefusal(
                                ultraserver=grant.ultraserver,
                                code="taken",
                                detail=f"taken by workload {owner}",
                                holders=(owner,),
                            ),
                        ),
                    )
        return Decision(granted=True, allocation=self._record(request, grants))
