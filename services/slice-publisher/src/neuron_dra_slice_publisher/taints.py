"""Device health as DRA device taints on the pool (no I/O).

A device the health probe reports unhealthy keeps its place in the pool and gets a taint
``neuron.aws.com/hardware-error=<ERROR_TYPE>``: effect ``NoSchedule`` while it is degraded
(the scheduler hands it to no new claim that does not tolerate the taint), ``NoExecute`` when
the error is uncorrectable (Kubernetes' device taint eviction also deletes the pods using it).
A node declared lost taints all its devices ``neuron.aws.com/node-lost`` (``NoExecute``).
The repair removes the taint. UltraServer nodes also taint their ``neuronnode`` device with
the worst taint of its chips: a whole node with a broken chip is not a whole node.

Where the cluster does not serve device taints (Kubernetes 1.34: DRADeviceTaints is alpha and
off), the apiserver would drop the field silently, so the publisher leaves tainted devices
out of the pool instead (see ``slices.build_pool``): the scheduler cannot hand out a device it
does not see, and the device is back with its repair.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime
from typing import Final, Literal

from neuron_dra_common.driver import NODE_DEVICE
from neuron_dra_common.events import DeviceHealthChanged, DeviceTaint

__all__ = [
    "HARDWARE_ERROR_KEY",
    "NODE_LOST_KEY",
    "DeviceTaint",
    "HealthTaints",
    "taint_json",
    "taint_of",
    "worst",
]

HARDWARE_ERROR_KEY: Final = "neuron.aws.com/hardware-error"
NODE_LOST_KEY: Final = "neuron.aws.com/node-lost"
_LABEL_VALUE: Final = re.compile(r"[^A-Za-z0-9_.-]")

Effect = Literal["NoSchedule", "NoExecute"]


def taint_json(taint: DeviceTaint) -> dict[str, str]:
    """``taint`` as a ResourceSlice device holds it."""
    # timeAdded is left to the apiserver, which sets it when the taint is new.
    return {"key": taint.key, "value": taint.value, "effect": taint.effect}


def _label_value(text: str) -> str:
    return _LABEL_VALUE.sub("_", text)[:63].strip("_.-") or "unknown"


def taint_of(event: DeviceHealthChanged) -> DeviceTaint | None:
    """The taint a health event calls for; ``None`` for a healthy (or unknown) device.

    An unhealthy report without a severity (an older probe) counts as uncorrectable.
    """
    if event.health != "Unhealthy":
        return None
    effect: Effect = "NoSchedule" if event.severity == "degraded" else "NoExecute"
    return DeviceTaint(
        key=HARDWARE_ERROR_KEY,
        value=_label_value(event.error_type or event.error_code or "unknown"),
        effect=effect,
    )


def worst(taints: Iterable[DeviceTaint]) -> DeviceTaint | None:
    """``NoExecute`` before ``NoSchedule``, then by key and value (so the choice is stable)."""
    ordered = sorted(taints, key=lambda t: (t.effect != "NoExecute", t.key, t.value))
    return ordered[0] if ordered else None


class HealthTaints:
    """Per node, the taint of each unhealthy device, and whether the node is lost."""

    def __init__(self) -> None:
        self._devices: dict[str, dict[str, tuple[DeviceTaint, datetime | None]]] = {}
        self._lost: set[str] = set()
        self._seen: dict[tuple[str, str], datetime] = {}
        # Why each device and node is as it is, for the taint changes the publisher reports.
        self._why: dict[tuple[str, str], str] = {}
        self._why_node: dict[str, str] = {}

    def apply(self, event: DeviceHealthChanged) -> bool:
        """Take ``event`` into account; ``True`` when the node's taints changed.

        An event older than the one already applied for the device is ignored (a durable
        consumer may redeliver after the start-up replay).
        """
        held = self._devices.setdefault(event.node, {})
        current = held.get(event.device)
        # The time of the last event seen, healthy ones included (a repair is news too).
        seen = self._seen.get((event.node, event.device))
        if seen is not None and event.observed_at is not None and event.observed_at < seen:
            return False
        if event.observed_at is not None:
            self._seen[(event.node, event.device)] = event.observed_at
        self._why[(event.node, event.device)] = _health_reason(event)
        taint = taint_of(event)
        if taint is None:
            return held.pop(event.device, None) is not None
        before = current[0] if current is not None else None
        held[event.device] = (taint, event.observed_at)
        return before != taint

    def set_lost(self, node: str, lost: bool, *, reason: str = "") -> bool:
        """Mark ``node`` lost (or found again); ``True`` when that changed anything."""
        if lost == (node in self._lost):
            return False
        self._why_node[node] = (
            f"node declared lost by the failure detector: {reason}".rstrip(": ")
            if lost
            else "node recovered: its heartbeats are steady again"
        )
        if lost:
            self._lost.add(node)
        else:
            self._lost.discard(node)
        return True

    def for_node(self, node: str, devices: Iterable[str]) -> dict[str, tuple[DeviceTaint, ...]]:
        """The taints of each of ``devices`` (those without any are left out)."""
        held = self._devices.get(node, {})
        lost = node in self._lost
        out: dict[str, tuple[DeviceTaint, ...]] = {}
        names = list(devices)
        for name in names:
            taints: list[DeviceTaint] = []
            if name in held:
                taints.append(held[name][0])
            if lost:
                taints.append(DeviceTaint(key=NODE_LOST_KEY, value="true", effect="NoExecute"))
            if taints:
                out[name] = tuple(sorted(set(taints)))
        if NODE_DEVICE in names:
            chips = worst(t for n, ts in out.items() if n != NODE_DEVICE for t in ts)
            if chips is not None:
                own = set(out.get(NODE_DEVICE, ()))
                own.add(chips)
                out[NODE_DEVICE] = tuple(sorted(own))
        return out

    def reason(self, node: str, device: str, *, lost_changed: bool) -> str:
        """Why ``device`` of ``node`` has the taints it has now (for the change report).

        ``lost_changed``: the node's lost taint came or went, which is then the reason. The
        whole-node device takes the reasons of its devices.
        """
        if lost_changed:
            return self._why_node.get(node, "")
        if device == NODE_DEVICE:
            held = self._devices.get(node, {})
            if not held:
                return "no device of the node has an error"
            return "; ".join(f"{d}: {self._why.get((node, d), '')}" for d in sorted(held))
        return self._why.get((node, device), "")


def _health_reason(event: DeviceHealthChanged) -> str:
    if event.health == "Healthy":
        return f"healthy again ({event.reason})" if event.reason else "healthy again"
    what = " ".join(p for p in (event.error_type or event.error_code, event.severity) if p)
    text = what or event.health.lower()
    if event.action:
        text += f", action {event.action}"
    if event.evidence:
        text += f": {event.evidence}"
    elif event.reason:
        text += f": {event.reason}"
    return text
