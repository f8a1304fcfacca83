"""The allocator's view of the fleet, fed by events (no I/O).

- ``NodeInventory``: a node of an UltraServer joins (or moves); a node whose driver is in the
  middle of an election is kept but not allocatable until the election ends;
- ``DeviceHealthChanged``: a node with any unhealthy device is not allocatable (whole nodes
  are handed out);
- ``NodeLost`` / ``NodeRecovered`` (the cluster failure detector): a lost node is not
  allocatable until it recovered;
- ``AllocationDecided`` / ``AllocationReleased``: replayed at start to rebuild who holds what.
  Once the allocator serves, it is the only writer of these and already applied its own, so
  the replay stops applying them (a late echo of an old release must not free a newer grant).
"""

from __future__ import annotations

import logging

from neuron_dra_common.events import (
    AllocationDecided,
    AllocationReleased,
    AnyEvent,
    DeviceHealthChanged,
    NodeInventory,
    NodeLost,
    NodeRecovered,
)
from neuron_dra_common.hardware.model import NodeHardware
from neuron_dra_common.ultraserver import ultraserver_name

from neuron_dra_topology_allocator.placement import Fleet, PlacementError, Request

__all__ = ["Membership", "Projection", "membership"]

log = logging.getLogger(__name__)

_ELECTION = "UltraServer election in progress"


class Membership:
    """Where a node sits in an UltraServer, as its hardware says."""

    __slots__ = ("modes", "node_id", "server_id", "server_id_2", "ultraserver")

    def __init__(
        self,
        *,
        ultraserver: str,
        node_id: int,
        modes: tuple[int, ...],
        server_id_2: str,
        server_id: str = "",
    ) -> None:
        self.ultraserver = ultraserver
        self.server_id = server_id
        self.node_id = node_id
        self.modes = modes
        self.server_id_2 = server_id_2


def membership(hardware: NodeHardware) -> Membership | None:
    """The node's UltraServer membership; ``None`` when it is in none (or cannot tell)."""
    us = hardware.ultraserver
    if us is None:
        return None
    server = us.reservation_id or us.server_id_4
    node_id = us.node_id if us.reservation_id else us.node_id_4
    if not server or set(server) == {"0"} or node_id is None or node_id < 0:
        return None
    return Membership(
        ultraserver=ultraserver_name(server),
        node_id=node_id,
        modes=us.supported_modes,
        server_id_2=us.server_id_2 or "",
        server_id=server,
    )


class Projection:
    """Applies events to a :class:`Fleet`."""

    def __init__(self, fleet: Fleet | None = None) -> None:
        self.fleet = fleet or Fleet()
        self.serving = False
        self._sick: dict[str, dict[str, str]] = {}  # node -> device -> reason
        self._busy: set[str] = set()
        self._lost: dict[str, str] = {}  # node -> why the failure detector declared it lost

    def apply(self, event: AnyEvent) -> None:
        if isinstance(event, NodeInventory):
            self._inventory(event)
        elif isinstance(event, DeviceHealthChanged):
            devices = self._sick.setdefault(event.node, {})
            if event.health == "Unhealthy":
                devices[event.device] = event.reason or f"{event.device} unhealthy"
            else:
                devices.pop(event.device, None)
            self._refresh_health(event.node)
        elif isinstance(event, NodeLost):
            self._lost[event.node] = f"lost ({event.reason or 'no heartbeat'})"
            self._refresh_health(event.node)
        elif isinstance(event, NodeRecovered):
            self._lost.pop(event.node, None)
            self._refresh_health(event.node)
        elif isinstance(event, AllocationDecided) and not self.serving:
            if event.granted and event.grants:
                request = Request(
                    workload=f"{event.workload.namespace}/{event.workload.name}",
                    uid=event.workload.uid,
                    size=event.topology_size or len(event.grants[0].nodes),
                    count=len(event.grants),
                    generation=event.generation,
                )
                self.fleet.release(event.workload.uid)
                self.fleet.adopt(request, event.grants)
        elif isinstance(event, AllocationReleased) and not self.serving:
            held = self.fleet.allocation(event.workload.uid)
            if held is not None and (not event.nodes or set(event.nodes) == set(held.nodes)):
                self.fleet.release(event.workload.uid)

    def _inventory(self, event: NodeInventory) -> None:
        us = event.hardware.ultraserver
        if us is not None and us.election_busy:
            self._busy.add(event.node)
            self._refresh_health(event.node)
            return
        self._busy.discard(event.node)
        member = membership(event.hardware)
        if member is None:
            self.fleet.remove_node(event.node)
            return
        try:
            self.fleet.upsert_node(
                event.node,
                ultraserver=member.ultraserver,
                instance_type=event.hardware.instance_type,
                node_id=member.node_id,
                modes=member.modes,
                server_id_2=member.server_id_2,
                server_id=member.server_id,
            )
        except PlacementError as exc:
            log.error("inventory not applied", extra={"node": event.node, "error": str(exc)})
            return
        self._refresh_health(event.node)

    def _refresh_health(self, node: str) -> None:
        sick = self._sick.get(node) or {}
        if node in self._lost:
            self.fleet.set_health(node, healthy=False, reason=self._lost[node])
        elif node in self._busy:
            self.fleet.set_health(node, healthy=False, reason=_ELECTION)
        elif sick:
            reasons = ", ".join(f"{d}: {r}" for d, r in sorted(sick.items()))
            self.fleet.set_health(node, healthy=False, reason=reasons)
        else:
            self.fleet.set_health(node, healthy=True)
