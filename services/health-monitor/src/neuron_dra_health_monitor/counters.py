"""The driver's error counters and links as deltas against what was seen before (no I/O).

The sysfs counters (``stats/hardware/<counter>/total`` per device, ``neuron_coreY/stats/status/
hw_error/total`` per core) count since the driver loaded. Only an increase is news: a probe
that starts (or restarts) takes the totals it finds, or the ones it saved, as its baseline,
so an old total is never reported again. A total that goes down means the driver was
reloaded: the device starts over.

Links: a device's ``connected_devices`` lists its NeuronLink neighbours; one missing from the
list the instance type should have is a link down. On an UltraServer node, a mode missing
from ``ultraserver_mode`` that the node once offered means a link between nodes is down.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final

import msgspec
from neuron_dra_common.hardware.model import NeuronDevice

__all__ = [
    "CORE_COUNTER_ERRORS",
    "DEVICE_COUNTER_ERRORS",
    "Increase",
    "compare_totals",
    "counter_totals",
    "lost_modes",
    "missing_links",
]

#: Device counters (``stats/hardware/<name>``) and the error an increase means.
DEVICE_COUNTER_ERRORS: Final = {
    "sram_ecc_uncorrected": "SRAM_UNCORRECTABLE_ERROR",
    "mem_ecc_uncorrected": "HBM_UNCORRECTABLE_ERROR",
    "mem_ecc_repairable_uncorrected": "HBM_REPAIRABLE_ERROR",
}
#: Per-core status counters and the error an increase means.
CORE_COUNTER_ERRORS: Final = {"hw_error": "NC_UNCORRECTABLE_ERROR"}

_ECC_FIELDS: Final = {
    "sram_ecc_uncorrected": "sram_uncorrected",
    "mem_ecc_uncorrected": "mem_uncorrected",
    "mem_ecc_repairable_uncorrected": "mem_repairable_uncorrected",
}


class Increase(msgspec.Struct, frozen=True, kw_only=True):
    """A counter that went up since the baseline."""

    device: int
    counter: str
    error_type: str
    before: int
    after: int
    core: int | None = None

    @property
    def evidence(self) -> str:
        where = f"neuron{self.device}"
        if self.core is not None:
            where += f"/neuron_core{self.core}"
        return f"{where} {self.counter} total {self.before} -> {self.after}"


def counter_totals(devices: Iterable[NeuronDevice]) -> dict[str, int]:
    """Every error counter's total, keyed ``<device>/<counter>`` or
    ``<device>/<core>/<counter>`` (a JSON-friendly form the probe also saves)."""
    out: dict[str, int] = {}
    for device in devices:
        for counter, field in _ECC_FIELDS.items():
            value = getattr(device.ecc, field)
            if value is not None:
                out[f"{device.index}/{counter}"] = value.total
        for core in device.cores:
            for counter in CORE_COUNTER_ERRORS:
                status = core.counters.get(counter)
                if status is not None:
                    out[f"{device.index}/{core.index}/{counter}"] = status.total
    return out


def _split(key: str) -> tuple[int, int | None, str]:
    parts = key.split("/")
    if len(parts) == 2:
        return int(parts[0]), None, parts[1]
    return int(parts[0]), int(parts[1]), parts[2]


def compare_totals(
    before: Mapping[str, int], after: Mapping[str, int]
) -> tuple[list[Increase], set[int]]:
    """What went up, and which devices started over (a total went down).

    A counter seen for the first time is a baseline, not an increase.

    >>> compare_totals({"0/sram_ecc_uncorrected": 1}, {"0/sram_ecc_uncorrected": 3})[0][0].evidence
    'neuron0 sram_ecc_uncorrected total 1 -> 3'
    """
    increases: list[Increase] = []
    reset: set[int] = set()
    for key, now in sorted(after.items()):
        then = before.get(key)
        if then is None:
            continue
        device, core, counter = _split(key)
        if now < then:
            reset.add(device)
        elif now > then:
            errors = CORE_COUNTER_ERRORS if core is not None else DEVICE_COUNTER_ERRORS
            increases.append(
                Increase(
                    device=device,
                    core=core,
                    counter=counter,
                    error_type=errors[counter],
                    before=then,
                    after=now,
                )
            )
    return [i for i in increases if i.device not in reset], reset


def missing_links(
    expected: Sequence[tuple[int, ...]], devices: Iterable[NeuronDevice]
) -> dict[int, tuple[int, ...]]:
    """Per device, the neighbours the instance type links it to that it does not list.

    >>> missing_links([(1,), (0,)], [NeuronDevice(index=0, connected_devices=())])
    {0: (1,)}
    """
    out: dict[int, tuple[int, ...]] = {}
    for device in devices:
        if device.index >= len(expected):
            continue
        gone = tuple(d for d in expected[device.index] if d not in device.connected_devices)
        if gone:
            out[device.index] = gone
    return out


def lost_modes(offered: Iterable[int], now: Iterable[int]) -> tuple[int, ...]:
    """The UltraServer modes once offered that the node no longer offers.

    >>> lost_modes((1, 2, 3, 4), (3, 4))
    (1, 2)
    """
    current = set(now)
    return tuple(sorted(m for m in set(offered) if m not in current))
