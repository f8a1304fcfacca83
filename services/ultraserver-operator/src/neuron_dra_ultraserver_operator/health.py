"""Which nodes are failed although Kubernetes may still call them Ready (no I/O).

Fed by the ``NEURON_HEALTH`` stream: ``NodeLost`` / ``NodeRecovered`` from the cluster failure
detector (seconds after a node stops, where the Node's Ready condition takes about 50 s), and
``DeviceHealthChanged`` with severity ``uncorrectable`` on any device (the node cannot run its
share of the workload until the device is repaired or the instance replaced). A workload
holding such a node applies its ``failureStrategy``, and no placement goes there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from neuron_dra_common.events import AnyEvent, DeviceHealthChanged, NodeLost, NodeRecovered

__all__ = ["NodeHealth"]


class NodeHealth(Mapping[str, str]):
    """node -> why it is failed; ``changed(node, failed)`` is called on every transition."""

    def __init__(self, changed: Callable[[str, bool], None] = lambda node, failed: None) -> None:
        self._lost: dict[str, str] = {}
        self._devices: dict[str, dict[str, str]] = {}
        self._changed = changed

    def apply(self, event: AnyEvent) -> None:
        if not isinstance(event, NodeLost | NodeRecovered | DeviceHealthChanged):
            return
        node = event.node
        before = node in self
        if isinstance(event, NodeLost):
            self._lost[node] = f"lost ({event.reason})" if event.reason else "lost"
        elif isinstance(event, NodeRecovered):
            self._lost.pop(node, None)
        else:
            devices = self._devices.setdefault(node, {})
            # Only an uncorrectable error fails the node; a degraded device keeps running.
            severity = str(getattr(event, "severity", "") or "")
            if event.health == "Unhealthy" and severity == "uncorrectable":
                what = str(getattr(event, "error_type", "") or event.reason or "error")
                devices[event.device] = f"{event.device} uncorrectable {what}"
            else:
                devices.pop(event.device, None)
            if not devices:
                del self._devices[node]
        after = node in self
        if before != after or after:
            self._changed(node, after)

    def __getitem__(self, node: str) -> str:
        reasons = []
        if node in self._lost:
            reasons.append(self._lost[node])
        reasons += sorted((self._devices.get(node) or {}).values())
        if not reasons:
            raise KeyError(node)
        return "; ".join(reasons)

    def __contains__(self, node: object) -> bool:
        return node in self._lost or node in self._devices

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(set(self._lost) | set(self._devices)))

    def __len__(self) -> int:
        return len(set(self._lost) | set(self._devices))
