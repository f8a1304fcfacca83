"""Each change of a device's taints, reported once on the bus (``DeviceTaintChanged``).

The publisher remembers, per node, the taints it last reported for each device. After a
pool is written (or found already current) the devices whose taints differ from that are
reported, and only then remembered: a publish that fails is tried again with the next
reconcile of the node, under the same message id (made of the pool generation that carries
the change), so JetStream keeps it once. At start the memory is filled from the stream itself,
so a restarted publisher neither repeats what was reported nor misses what was not.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime

import msgspec
from neuron_dra_common.events import AnyEvent, DeviceTaint, DeviceTaintChanged

from neuron_dra_slice_publisher.taints import NODE_LOST_KEY, HealthTaints

__all__ = ["Publish", "TaintAnnouncer", "msg_id"]

#: Publish one event under a message id (the bus publisher's ``publish``).
Publish = Callable[[DeviceTaintChanged, str], Awaitable[object]]
Taints = Mapping[str, tuple[DeviceTaint, ...]]


class TaintAnnouncer:
    """What was reported per device, and the reports a node's new taints call for."""

    def __init__(self, publish: Publish | None = None, *, withheld: bool = False) -> None:
        self._publish = publish
        #: Tainted devices are left out of the pool rather than listed with their taints.
        self.withheld = withheld
        self._reported: dict[str, dict[str, tuple[DeviceTaint, ...]]] = {}

    def seed(self, event: AnyEvent) -> None:
        """Take back a report made before a restart (the latest per device, oldest first)."""
        if isinstance(event, DeviceTaintChanged):
            self._remember(event)

    def _remember(self, event: DeviceTaintChanged) -> None:
        held = self._reported.setdefault(event.node, {})
        if event.taints:
            held[event.device] = tuple(event.taints)
        else:
            held.pop(event.device, None)

    def changes(
        self,
        node: str,
        taints: Taints,
        *,
        health: HealthTaints,
        generation: int,
        now: datetime | None = None,
    ) -> list[DeviceTaintChanged]:
        """The reports that ``taints`` (the node's devices with taints, in the pool of
        ``generation``) call for; empty when nothing changed since the last report."""
        held = self._reported.get(node, {})
        out: list[DeviceTaintChanged] = []
        for device in sorted(set(taints) | set(held)):
            before, after = held.get(device, ()), tuple(taints.get(device, ()))
            if before == after:
                continue
            lost_changed = _lost(before) != _lost(after)
            out.append(
                DeviceTaintChanged(
                    node=node,
                    device=device,
                    taints=after,
                    previous=before,
                    reason=health.reason(node, device, lost_changed=lost_changed),
                    withheld=self.withheld,
                    pool_generation=generation,
                    changed_at=now or datetime.now(UTC),
                )
            )
        return out

    async def announce(
        self, node: str, taints: Taints, *, health: HealthTaints, generation: int
    ) -> int:
        """Publish the reports :meth:`changes` calls for; how many there were."""
        if self._publish is None:
            return 0
        events = self.changes(node, taints, health=health, generation=generation)
        for event in events:
            await self._publish(event, msg_id(event))
            self._remember(event)
        return len(events)


def msg_id(event: DeviceTaintChanged) -> str:
    """The same change of the same pool generation always has the same id (a send repeated
    after a failure is kept once); the digest of the change keeps apart two changes that a
    pool deleted and created again (its generation starting over) could otherwise share."""
    change = msgspec.json.encode((event.previous, event.taints))
    digest = hashlib.sha256(change).hexdigest()[:12]
    return f"taint-{event.node}-{event.device}-{event.pool_generation}-{digest}"


def _lost(taints: tuple[DeviceTaint, ...]) -> bool:
    return any(t.key == NODE_LOST_KEY for t in taints)
