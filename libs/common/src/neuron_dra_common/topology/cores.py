"""NeuronCore ids as the Neuron runtime reads them in ``NEURON_RT_VISIBLE_CORES``.

Host-global logical core ids: device ``d`` with ``k`` logical cores owns ``d*k .. d*k+k-1``.
The DRA plugin's container edits and the device plugin's Allocate write the same variable, so
both format it here.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["device_cores", "format_ranges", "visible_cores"]


def format_ranges(ids: Iterable[int]) -> str:
    """Sorted ids as a comma list of ranges.

    >>> format_ranges([13, 4, 5, 6, 7, 12, 14, 15, 9])
    '4-7,9,12-15'
    """
    ordered = sorted(set(ids))
    parts: list[str] = []
    start = prev = None
    for value in ordered:
        if start is None:
            start = prev = value
        elif prev is not None and value == prev + 1:
            prev = value
        else:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = value
    if start is not None:
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ",".join(parts)


def device_cores(device: int, cores_per_device: int) -> range:
    """The host-global logical core ids of ``device``.

    >>> list(device_cores(3, 4))
    [12, 13, 14, 15]
    """
    return range(device * cores_per_device, (device + 1) * cores_per_device)


def visible_cores(devices: Iterable[int], cores_per_device: int) -> str:
    """``NEURON_RT_VISIBLE_CORES`` for ``devices`` with ``cores_per_device`` logical cores each.

    >>> visible_cores([1, 3], 4)
    '4-7,12-15'
    """
    return format_ranges(core for d in devices for core in device_cores(d, cores_per_device))
