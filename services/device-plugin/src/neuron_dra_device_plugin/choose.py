"""Which devices or cores to prefer for a container (``GetPreferredAllocation``). Pure.

Devices come as one of the node's connected sets (:mod:`neuron_dra_common.topology`): torus
rows on trn1/trn2, contiguous ring windows on inf1/inf2. Among the free sets that hold what
the container must keep, the one that overlaps the fewest other free sets wins (ties: the
lowest ids), so a ring window is taken from the edge of a free run and leaves the longest
windows for later requests.

Cores are packed on as few devices as possible: the devices the container already uses first,
then a device whose free cores just fit what is left, else the device with the most free
cores; lowest core ids first. Nine cores on an empty node of 4-core devices are ``0-8``.
"""

from __future__ import annotations

from collections.abc import Iterable

from neuron_dra_common.topology import InstanceSpec, free_connected_sets, valid_counts

__all__ = ["preferred_cores", "preferred_devices"]


def preferred_devices(
    spec: InstanceSpec, *, available: Iterable[int], must_include: Iterable[int], size: int
) -> tuple[int, ...]:
    """The connected set of ``size`` devices to prefer, or ``()`` when there is none.

    An empty answer lets the kubelet choose by itself (a count the instance cannot serve as a
    connected set is refused later, in Allocate).

    >>> from neuron_dra_common.topology import instance_spec
    >>> preferred_devices(instance_spec("inf2.48xlarge"), available=[2, 3, 4, 5, 6],
    ...                   must_include=[], size=2)
    (2, 3)
    """
    must = frozenset(must_include)
    if size not in valid_counts(spec):
        return ()
    free = frozenset(available) | must
    candidates = [s for s in free_connected_sets(spec, count=size, free=free) if must <= set(s)]
    if not candidates:
        return ()

    def overlaps(chosen: tuple[int, ...]) -> int:
        members = set(chosen)
        return sum(1 for other in candidates if other != chosen and members & set(other))

    return min(candidates, key=lambda s: (overlaps(s), s))


def preferred_cores(
    *,
    available: Iterable[int],
    must_include: Iterable[int],
    size: int,
    cores_per_device: int,
) -> tuple[int, ...]:
    """``size`` cores from ``available`` (with ``must_include``) on as few devices as possible.

    Returns ``()`` when fewer than ``size`` cores are free.

    >>> preferred_cores(available=range(16), must_include=[], size=9, cores_per_device=4)
    (0, 1, 2, 3, 4, 5, 6, 7, 8)
    >>> preferred_cores(available=[0, 1, 4, 5, 6, 7], must_include=[], size=2, cores_per_device=4)
    (0, 1)
    """
    chosen = set(must_include)
    free: dict[int, list[int]] = {}
    for core in sorted(set(available) - chosen):
        free.setdefault(core // cores_per_device, []).append(core)
    need = size - len(chosen)
    if need < 0 or sum(len(c) for c in free.values()) < need:
        return ()
    used = {c // cores_per_device for c in chosen}
    while need > 0:
        device = _next_device(free, used=used, need=need)
        take = free.pop(device)[:need]
        chosen.update(take)
        used.add(device)
        need -= len(take)
    return tuple(sorted(chosen))


def _next_device(free: dict[int, list[int]], *, used: set[int], need: int) -> int:
    started = [d for d in free if d in used]
    if started:
        return min(started)
    fitting = [d for d, cores in free.items() if len(cores) >= need]
    if fitting:
        return min(fitting, key=lambda d: (len(free[d]), d))
    return min(free, key=lambda d: (-len(free[d]), d))
