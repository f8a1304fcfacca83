"""Which devices of a node are linked to which, per link topology.

The torus order is the one the driver lists in ``connected_devices``: up, left, down, right,
wrapping around the 4x4 grid (device 0 -> 12, 3, 4, 1; device 5 -> 1, 4, 9, 6). The driver's
order for rings and lines is not published; we list the lower neighbour first.
"""

from __future__ import annotations

from collections.abc import Iterable

from neuron_dra_common.topology.catalog import InstanceSpec, LinkTopology

__all__ = [
    "TORUS_SIDE",
    "adjacency",
    "is_linked_graph",
    "neighbours",
    "torus_column",
    "torus_row",
]

#: Rows and columns of the torus.
TORUS_SIDE = 4


def torus_row(device: int) -> int:
    """The torus row of ``device`` (published as ``topology_x``)."""
    return device // TORUS_SIDE


def torus_column(device: int) -> int:
    """The torus column of ``device`` (published as ``topology_y``)."""
    return device % TORUS_SIDE


def neighbours(kind: LinkTopology, *, devices: int, device: int) -> tuple[int, ...]:
    """The devices linked to ``device`` on a node of ``devices`` devices wired as ``kind``.

    >>> neighbours(LinkTopology.TORUS4X4, devices=16, device=0)
    (12, 3, 4, 1)
    >>> neighbours(LinkTopology.RING, devices=12, device=11)
    (10, 0)
    """
    if not 0 <= device < devices:
        raise ValueError(f"device {device} is outside 0..{devices - 1}")
    match kind:
        case LinkTopology.TORUS4X4:
            if devices != TORUS_SIDE * TORUS_SIDE:
                raise ValueError(f"a 4x4 torus has 16 devices, not {devices}")
            row, col = torus_row(device), torus_column(device)
            up = ((row - 1) % TORUS_SIDE) * TORUS_SIDE + col
            left = row * TORUS_SIDE + (col - 1) % TORUS_SIDE
            down = ((row + 1) % TORUS_SIDE) * TORUS_SIDE + col
            right = row * TORUS_SIDE + (col + 1) % TORUS_SIDE
            return (up, left, down, right)
        case LinkTopology.RING:
            # Two devices in a "ring" share one link; list it once.
            return _unique([(device - 1) % devices, (device + 1) % devices], exclude=device)
        case LinkTopology.LINE:
            return tuple(d for d in (device - 1, device + 1) if 0 <= d < devices)
        case LinkTopology.ALL_TO_ALL:
            return tuple(d for d in range(devices) if d != device)
        case LinkTopology.NONE:
            return ()


def adjacency(spec: InstanceSpec) -> tuple[tuple[int, ...], ...]:
    """Neighbour lists of every device of ``spec``, indexed by device id."""
    return tuple(
        neighbours(spec.topology, devices=spec.devices, device=d) for d in range(spec.devices)
    )


def is_linked_graph(spec: InstanceSpec, devices: Iterable[int]) -> bool:
    """True when ``devices`` form one connected piece using only links among themselves."""
    members = set(devices)
    if not members:
        return False
    table = adjacency(spec)
    start = min(members)
    seen = {start}
    todo = [start]
    while todo:
        for nxt in table[todo.pop()]:
            if nxt in members and nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen == members


def _unique(values: list[int], *, exclude: int) -> tuple[int, ...]:
    out: list[int] = []
    for v in values:
        if v != exclude and v not in out:
            out.append(v)
    return tuple(out)
