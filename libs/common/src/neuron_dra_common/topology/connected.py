"""Connected device sets: which groups of devices one request may receive on a node.

The rules, per link topology:

* **4x4 torus** (trn1, trn1n, trn2, trn2u): 1, 4, 8 or 16 devices. Four devices are one torus
  row (``[0-3] [4-7] [8-11] [12-15]``), eight are two adjacent rows aligned on a pair
  (``[0-7] [8-15]``). Square blocks such as ``[9, 10, 13, 14]`` are not offered, as AWS does
  not offer them.
* **ring** (inf2.48xlarge, inf1 with more than one device) and **line** (inf2.24xlarge): any
  count up to the node's devices, as that many contiguous device ids.
  *Ring windows wrap*: on inf2.48xlarge ``[11, 0]`` is a valid pair, because device 11 has a
  real link back to device 0; refusing it would strand free, connected devices at the ends of
  the numbering. A line never wraps (inf2.24xlarge has no 5 -> 0 link). inf1's devices are
  physically a chain that AWS's scheduler extension treats as a ring; the catalog follows the
  extension, so inf1 windows wrap too.
* **all-to-all** (Trn3): every subset is connected, so every count up to 16 is valid.
* **none** (single-device instances): 1.

Any other count is refused with the scheduler extension's text, see :func:`check_request`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from neuron_dra_common.topology.catalog import InstanceSpec, LinkTopology, instance_spec

__all__ = [
    "InvalidDeviceCount",
    "check_request",
    "connected_sets",
    "free_connected_sets",
    "is_connected_set",
    "valid_counts",
]

_TORUS_COUNTS = (1, 4, 8, 16)


class InvalidDeviceCount(ValueError):
    """A request for a number of devices the instance type cannot serve as a connected set."""

    def __init__(self, instance_type: str, count: int) -> None:
        self.instance_type = instance_type
        self.count = count
        super().__init__(
            f"Instance type {instance_type} does not support requests for device: {count}. "
            "Please request a different number of devices."
        )


def _resolve(instance: InstanceSpec | str) -> InstanceSpec:
    return instance if isinstance(instance, InstanceSpec) else instance_spec(instance)


def valid_counts(instance: InstanceSpec | str) -> tuple[int, ...]:
    """The device counts a single request may ask for on ``instance``, ascending.

    >>> valid_counts("trn2.48xlarge")
    (1, 4, 8, 16)
    >>> valid_counts("inf2.24xlarge")
    (1, 2, 3, 4, 5, 6)
    """
    spec = _resolve(instance)
    if spec.topology is LinkTopology.TORUS4X4:
        return _TORUS_COUNTS
    return tuple(range(1, spec.devices + 1))


def check_request(instance: InstanceSpec | str, count: int) -> None:
    """Refuse a request for ``count`` devices that ``instance`` cannot serve.

    Raises :class:`InvalidDeviceCount` whose message is the scheduler extension's, verbatim:
    ``Instance type trn1.32xlarge does not support requests for device: 7. Please request a
    different number of devices.`` The name in the message is the one passed in (as the node
    labels it), or the catalog name when a spec is passed.
    """
    spec = _resolve(instance)
    if count not in valid_counts(spec):
        name = instance if isinstance(instance, str) else spec.name
        raise InvalidDeviceCount(name, count)


def connected_sets(instance: InstanceSpec | str, count: int) -> tuple[tuple[int, ...], ...]:
    """Every connected set of ``count`` devices on ``instance``.

    Each set is a tuple of device ids in ascending order; sets are ordered by where they start
    (a wrapping ring window starts at its highest id, so it comes last). A count that is not
    valid yields no sets.

    >>> connected_sets("trn2.48xlarge", 8)
    ((0, 1, 2, 3, 4, 5, 6, 7), (8, 9, 10, 11, 12, 13, 14, 15))
    >>> connected_sets("inf2.48xlarge", 2)[-1]
    (0, 11)
    """
    spec = _resolve(instance)
    if count not in valid_counts(spec):
        return ()
    n = spec.devices
    if count == n:
        return (tuple(range(n)),)
    match spec.topology:
        case LinkTopology.TORUS4X4:
            # Rows, and pairs of rows, aligned on their size.
            return tuple(tuple(range(start, start + count)) for start in range(0, n, count))
        case LinkTopology.RING:
            return tuple(tuple(sorted((start + k) % n for k in range(count))) for start in range(n))
        case LinkTopology.LINE:
            return tuple(tuple(range(start, start + count)) for start in range(n - count + 1))
        case LinkTopology.ALL_TO_ALL:
            return tuple(itertools.combinations(range(n), count))
        case LinkTopology.NONE:
            return tuple((d,) for d in range(n))


def is_connected_set(instance: InstanceSpec | str, devices: Iterable[int]) -> bool:
    """True when ``devices`` (in any order) is one of the instance's connected sets."""
    chosen = tuple(sorted(set(devices)))
    return chosen in connected_sets(instance, len(chosen))


def free_connected_sets(
    instance: InstanceSpec | str, *, count: int, free: Iterable[int]
) -> tuple[tuple[int, ...], ...]:
    """The connected sets of ``count`` devices made only of ``free`` devices.

    This is what a scheduler extender needs to decide whether a node fits a request: an empty
    result means the node cannot serve it now (or ever, see :func:`check_request`).
    """
    available = set(free)
    return tuple(s for s in connected_sets(instance, count) if available.issuperset(s))
