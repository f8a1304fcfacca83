"""The probe's view of its node's devices: which faults each one has, and what to publish
when that changes (no I/O).

A device carries a set of faults, one per error type. Each fault comes from somewhere: a
kernel log line, a counter increase, a missing link, or the bus (what the probe published
before a restart). What clears it depends on where it came from: a driver reload (the
device's counters start over) clears everything the hardware reported; a link coming back
clears its link fault. Every change of a device's fault set is one ``DeviceHealthChanged``,
describing the worst fault (uncorrectable before degraded, then the oldest).

Severity and action follow the Neuron documentation: a repairable HBM error degrades the
device until the driver is reloaded or the node rebooted; every other error means the
instance should be replaced.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, Final, Literal

import msgspec
from neuron_dra_common.events import DeviceHealthChanged, HealthSeverity

__all__ = [
    "ACCELERATED_HARDWARE_CONDITION",
    "ACTION_RELOAD",
    "ACTION_REPLACE",
    "LINK_DOWN",
    "NEURON_HEALTH_CONDITION",
    "REPAIRABLE_HBM",
    "Fault",
    "HealthBook",
    "Source",
    "action_of",
    "node_conditions",
    "severity_of",
]

REPAIRABLE_HBM: Final = "HBM_REPAIRABLE_ERROR"
LINK_DOWN: Final = "NEURONLINK_DOWN"
ACTION_RELOAD: Final = "reload-driver-or-reboot"
ACTION_REPLACE: Final = "replace-instance"

#: The node-problem-detector's condition for Neuron errors (reasons ``NeuronHasError_<TYPE>``,
#: ``NeuronHasNoError``); ``True`` means a problem.
NEURON_HEALTH_CONDITION: Final = "NeuronHealth"
#: The condition the EKS node monitoring agent sets for accelerators and EKS node auto repair
#: acts on (``False`` means a problem):
#: https://docs.aws.amazon.com/eks/latest/userguide/node-health-nma.html
ACCELERATED_HARDWARE_CONDITION: Final = "AcceleratedHardwareReady"

Source = Literal["kernel", "counter", "link", "bus"]
_RANK: Final = {"uncorrectable": 2, "degraded": 1, "": 0}


def severity_of(error_type: str) -> HealthSeverity:
    """``degraded`` for a repairable HBM error or a link down; ``uncorrectable`` otherwise."""
    if error_type in (REPAIRABLE_HBM, LINK_DOWN):
        return "degraded"
    return "uncorrectable"


def action_of(error_type: str) -> str:
    """What to do about ``error_type``, as the Neuron documentation says."""
    return ACTION_RELOAD if error_type == REPAIRABLE_HBM else ACTION_REPLACE


class Fault(msgspec.Struct, frozen=True, kw_only=True):
    """One error a device has, with its proof and where it was seen."""

    error_type: str
    source: Source
    evidence: str = ""
    core: int | None = None
    since: datetime | None = None

    @property
    def severity(self) -> HealthSeverity:
        return severity_of(self.error_type)

    @property
    def action(self) -> str:
        return action_of(self.error_type)


def _worst(faults: Iterable[Fault]) -> Fault | None:
    ordered = list(faults)
    if not ordered:
        return None
    # Stable: among equals the first raised stays first.
    return max(ordered, key=lambda f: _RANK[f.severity])


class HealthBook:
    """The faults of every device of one node, and the events their changes make.

    >>> book = HealthBook(node="n1")
    >>> event = book.add("neurondevice3", Fault(error_type="DMA_ERROR", source="kernel"), now=t)
    >>> event.health, event.severity, event.action
    ('Unhealthy', 'uncorrectable', 'replace-instance')
    """

    def __init__(self, *, node: str) -> None:
        self.node = node
        self._faults: dict[str, dict[str, Fault]] = {}

    def faults(self, device: str) -> tuple[Fault, ...]:
        return tuple(self._faults.get(device, {}).values())

    def devices(self) -> tuple[str, ...]:
        return tuple(sorted(d for d, f in self._faults.items() if f))

    def seed(self, event: DeviceHealthChanged) -> None:
        """Take back what was published before a restart (the latest event per device)."""
        if event.node != self.node:
            return
        if event.health != "Unhealthy" or not event.error_type:
            self._faults.pop(event.device, None)
            return
        self._faults[event.device] = {
            event.error_type: Fault(
                error_type=event.error_type,
                source="bus",
                evidence=event.evidence,
                core=event.core,
                since=event.observed_at,
            )
        }

    def add(self, device: str, fault: Fault, *, now: datetime) -> DeviceHealthChanged | None:
        """Record ``fault``; the event to publish, or ``None`` when the device already had
        an error of that type."""
        held = self._faults.setdefault(device, {})
        if fault.error_type in held:
            return None
        before = bool(held)
        held[fault.error_type] = fault
        return self._event(device, previous_unhealthy=before, now=now)

    def clear(
        self,
        device: str,
        *,
        sources: Iterable[Source],
        error_type: str | None = None,
        why: str,
        now: datetime,
    ) -> DeviceHealthChanged | None:
        """Drop the faults of ``device`` that came from ``sources`` (only ``error_type`` if
        given); the event to publish, or ``None`` when nothing was dropped."""
        held = self._faults.get(device)
        if not held:
            return None
        wanted = set(sources)
        gone = [
            t
            for t, f in held.items()
            if f.source in wanted and (error_type is None or t == error_type)
        ]
        if not gone:
            return None
        for t in gone:
            del held[t]
        return self._event(device, previous_unhealthy=True, now=now, why=why)

    def _event(
        self, device: str, *, previous_unhealthy: bool, now: datetime, why: str = ""
    ) -> DeviceHealthChanged:
        held = self._faults.get(device, {})
        worst = _worst(held.values())
        previous: Any = "Unhealthy" if previous_unhealthy else "Healthy"
        if worst is None:
            self._faults.pop(device, None)
            return DeviceHealthChanged(
                node=self.node,
                device=device,
                health="Healthy",
                previous=previous,
                reason=why or "no error",
                observed_at=now,
            )
        others = sorted(t for t in held if t != worst.error_type)
        where = device if worst.core is None else f"{device} core {worst.core}"
        reason = f"{worst.error_type} on {where}: {worst.action}"
        if others:
            reason += f" (also {', '.join(others)})"
        return DeviceHealthChanged(
            node=self.node,
            device=device,
            health="Unhealthy",
            previous=previous,
            reason=reason,
            observed_at=now,
            error_type=worst.error_type,
            severity=worst.severity,
            evidence=worst.evidence,
            action=worst.action,
            core=worst.core,
        )

    def node_conditions(self) -> dict[str, tuple[str, str, str]]:
        """See :func:`node_conditions`."""
        return node_conditions({d: tuple(f.values()) for d, f in self._faults.items() if f})


def node_conditions(
    faults: dict[str, tuple[Fault, ...]],
) -> dict[str, tuple[str, str, str]]:
    """The node's conditions as ``type -> (status, reason, message)``.

    ``NeuronHealth`` is ``True`` with ``NeuronHasError_<TYPE>`` (the worst error on the node)
    while any device has an error; ``AcceleratedHardwareReady`` is ``False`` while any device
    has an error that needs the driver reloaded or the instance replaced — a link down alone
    degrades the node without asking for its repair.

    >>> node_conditions({})["NeuronHealth"]
    ('False', 'NeuronHasNoError', 'No Neuron device reports an error')
    """
    everything = [(d, f) for d, fs in sorted(faults.items()) for f in fs]
    worst = _worst(f for _, f in everything)
    if worst is None:
        healthy = "No Neuron device reports an error"
        return {
            NEURON_HEALTH_CONDITION: ("False", "NeuronHasNoError", healthy),
            ACCELERATED_HARDWARE_CONDITION: ("True", "NeuronHasNoError", healthy),
        }
    listed = "; ".join(f"{d}: {f.error_type}" for d, f in everything)
    message = f"{listed}; action: {worst.action}"
    reason = f"NeuronHasError_{worst.error_type}"
    serious = [f for _, f in everything if f.error_type != LINK_DOWN]
    ready = (
        ("False", f"NeuronHasError_{_worst(serious).error_type}", message)  # type: ignore[union-attr]
        if serious
        else ("True", "NeuronHasNoError", f"degraded only: {listed}")
    )
    return {
        NEURON_HEALTH_CONDITION: ("True", reason, message[:1024]),
        ACCELERATED_HARDWARE_CONDITION: (ready[0], ready[1], ready[2][:1024]),
    }
