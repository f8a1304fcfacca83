"""Replacing part of an allocation: keep the healthy units, place the rest anew (no I/O).

A workload that asks with fewer ``nodes`` than ``serverCount x topologySize`` keeps exactly
the units those nodes form and gets the missing units placed again, avoiding the
UltraServers it names in ``exclude`` (those of its failed nodes). All or nothing: when the
missing units do not fit, the workload keeps what it held before, unchanged.
"""

from __future__ import annotations

import msgspec
from neuron_dra_common.events import UltraServerGrant

from neuron_dra_topology_allocator.placement import Allocation, Decision, Fleet, Request, Strategy

__all__ = ["replace"]


def replace(
    fleet: Fleet,
    request: Request,
    kept: tuple[UltraServerGrant, ...],
    *,
    strategy: Strategy = Strategy.BEST_FIT,
) -> Decision:
    """Keep ``kept`` (whole units of the workload), place ``request.count - len(kept)`` more."""
    previous = fleet.release(request.uid)
    conflict = [n for g in kept for n in g.nodes if fleet.holder(n) not in (None, request.uid)]
    if conflict or len(kept) >= request.count:
        _restore(fleet, request, previous)
        if conflict:
            return Decision(
                granted=False,
                reason=f"nodes {', '.join(conflict)} are held by another workload",
            )
        return fleet.adopt(request, kept)
    # Keep the healthy units out of the pool while the rest is placed.
    fleet.adopt(request, kept)
    free_indices = sorted(set(range(request.count)) - {g.index for g in kept})
    probe = msgspec.structs.replace(
        request, uid=f"{request.uid}#replacement", count=len(free_indices)
    )
    placed = fleet.place(probe, strategy=strategy)
    fleet.release(probe.uid)
    fleet.release(request.uid)
    if not placed.granted or placed.allocation is None:
        _restore(fleet, request, previous)
        return msgspec.structs.replace(
            placed,
            reason=f"no replacement fits ({placed.reason})" if placed.reason else placed.reason,
        )
    new = tuple(
        msgspec.structs.replace(grant, index=index)
        for index, grant in zip(free_indices, placed.allocation.grants, strict=True)
    )
    grants = tuple(sorted(kept + new, key=lambda g: g.index))
    return fleet.adopt(request, grants)


def _restore(fleet: Fleet, request: Request, previous: Allocation | None) -> None:
    fleet.release(request.uid)
    if previous is not None:
        fleet.adopt(request, previous.grants)
