"""Answers allocation requests: decide, record the decision on the bus, reply.

A grant is stored in the ``NEURON_ALLOCATION`` stream before the reply leaves, so a restarted
allocator rebuilds it; its message id is the workload UID and generation, so a repeated
request stores nothing twice. Requests are handled one at a time (see ``bus.rpc``), which is
what makes two workloads racing for the last UltraServer end with exactly one winner.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
import zlib
from collections.abc import Sequence
from typing import Final, Protocol

import msgspec
from neuron_dra_common.bus import PublishResult, RetryLater
from neuron_dra_common.events import (
    AllocationDecided,
    AllocationReleased,
    AllocationRequested,
    AnyEvent,
    Event,
    UltraServerGrant,
)
from neuron_dra_common.telemetry import Counter, Histogram, get_tracer
from neuron_dra_common.ultraserver import TOPOLOGY_SIZES, modes_for_size, ultraserver_name

from neuron_dra_topology_allocator.placement import (
    UNITS,
    Decision,
    Fleet,
    PlacementError,
    Request,
    Strategy,
)
from neuron_dra_topology_allocator.projection import Projection
from neuron_dra_topology_allocator.replacement import replace

__all__ = ["Allocator", "EventSink", "NotReady"]

log = logging.getLogger(__name__)

_TRACER: Final = get_tracer("neuron_dra_topology_allocator")

DECISIONS = Counter(
    "neuron_dra_allocator_decisions_total", "Allocation decisions by outcome", ["outcome"]
)
DECISION_SECONDS = Histogram(
    "neuron_dra_allocator_decision_seconds",
    "Time to place one request (in memory, without the bus)",
    buckets=(0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05),
)


class EventSink(Protocol):
    async def publish(self, event: Event, *, msg_id: str | None = None) -> PublishResult: ...


class NotReady(RetryLater):
    """The allocator has not finished reading the fleet; the requester retries."""


class Allocator:
    """The request handler around a :class:`Projection`."""

    def __init__(
        self, projection: Projection, *, sink: EventSink, strategy: Strategy = Strategy.BEST_FIT
    ) -> None:
        self.projection = projection
        self._sink = sink
        self._strategy = strategy

    @property
    def fleet(self) -> Fleet:
        return self.projection.fleet

    async def handle(self, event: AnyEvent) -> Event:
        if not self.projection.serving:
            raise NotReady("topology allocator: still reading the fleet from the bus; retry")
        if isinstance(event, AllocationRequested):
            return await self.allocate(event)
        if isinstance(event, AllocationReleased):
            return await self.release(event)
        raise PlacementError(
            f"topology allocator: cannot answer {event.event_type()}; send "
            "allocation.requested.v1 or allocation.released.v1"
        )

    async def allocate(self, event: AllocationRequested) -> AllocationDecided:
        """Decide ``event`` in a span under the request's (the operator's reconcile, whose
        trace context the request carries in its headers)."""
        ref = event.workload
        with _TRACER.start_as_current_span(
            "allocate NeuronUltraServerWorkload",
            attributes={
                "k8s.namespace.name": ref.namespace,
                "neuron.workload.name": ref.name,
                "neuron.workload.uid": ref.uid,
                "neuron.topology_size": event.topology_size,
                "neuron.server_count": event.server_count,
                "neuron.generation": event.generation,
            },
        ) as span:
            decided = await self._allocate(event)
            span.set_attribute("neuron.granted", decided.granted)
            if decided.granted:
                span.set_attribute("neuron.nodes", list(decided.nodes))
                span.set_attribute("neuron.ultraservers", list(decided.ultraservers))
            else:
                span.set_attribute("neuron.reason", decided.reason)
            return decided

    async def _allocate(self, event: AllocationRequested) -> AllocationDecided:
        ref = event.workload
        request = Request(
            workload=f"{ref.namespace}/{ref.name}",
            uid=ref.uid,
            size=event.topology_size,
            count=event.server_count,
            instance_type=event.instance_type,
            generation=event.generation,
            exclude=_keys(event.exclude_ultraservers),
        )
        _check(event, workload=request.workload)
        fresh = self.fleet.allocation(ref.uid) is None
        started = time.perf_counter()
        replacing = 0 < len(event.nodes) < event.topology_size * event.server_count
        if replacing:
            kept = self._kept(ref.uid, self._grants(event.nodes, event.topology_size))
            decision = replace(self.fleet, request, kept, strategy=self._strategy)
        elif event.nodes:
            decision = self.fleet.adopt(request, self._grants(event.nodes, event.topology_size))
        else:
            decision = self.fleet.place(request, strategy=self._strategy)
        DECISION_SECONDS.observe(time.perf_counter() - started)
        decided = _decided(event, decision)
        if decision.granted and (fresh or replacing):
            # The id names the nodes: a workload placed again after a release (a restart of
            # all, a replacement of its only unit) holds other nodes under the same generation,
            # and that decision must be stored, not dropped as a duplicate of the first.
            nodes_id = zlib.crc32(",".join(decided.nodes).encode())
            try:
                await self._sink.publish(
                    decided,
                    msg_id=f"decided-{ref.uid}-{event.generation}-{len(decided.nodes)}-{nodes_id}",
                )
            except Exception:
                # Not recorded means not granted: a restart would not know about it.
                self.fleet.release(ref.uid)
                raise
            DECISIONS.labels("granted").inc()
        elif not decision.granted:
            DECISIONS.labels("refused").inc()
            await self._sink.publish(
                decided,
                msg_id=f"refused-{ref.uid}-{event.generation}-{zlib.crc32(decided.reason.encode())}",
            )
        return decided

    def _grants(self, nodes: Sequence[str], size: int) -> tuple[UltraServerGrant, ...]:
        """Grants for nodes a workload already records, in its order, ``size`` at a time."""
        grants = []
        for index in range(0, len(nodes), max(size, 1)):
            chunk = tuple(nodes[index : index + size])
            where = [self._where(n) for n in chunk]
            us = where[0][0] if where and where[0] else ""
            ids = tuple(w[1] if w else -1 for w in where)
            mask = sum(1 << i for i in ids if i >= 0)
            mode = next(
                (m for u, m in UNITS.get(size, ()) if u == mask), (modes_for_size(size) or (0,))[0]
            )
            grants.append(
                UltraServerGrant(
                    ultraserver=us,
                    index=index // max(size, 1),
                    nodes=chunk,
                    node_ids=ids,
                    mode=mode,
                    server_id=self.fleet.server_id(us, size=size, first=chunk[0] if chunk else ""),
                )
            )
        return tuple(grants)

    def _kept(self, uid: str, grants: tuple[UltraServerGrant, ...]) -> tuple[UltraServerGrant, ...]:
        """The units a replacement keeps, with the index each has in what ``uid`` holds."""
        held = self.fleet.allocation(uid)
        index = {frozenset(g.nodes): g.index for g in held.grants} if held else {}
        out = [
            msgspec.structs.replace(g, index=index.get(frozenset(g.nodes), g.index)) for g in grants
        ]
        if len({g.index for g in out}) != len(out):
            return grants  # not units it holds: keep the order they were sent in
        return tuple(out)

    def _where(self, node: str) -> tuple[str, int] | None:
        return self.fleet.position(node)

    async def release(self, event: AllocationReleased) -> AllocationReleased:
        held = self.fleet.release(event.workload.uid)
        released = AllocationReleased(
            request_id=event.request_id or str(uuid.uuid4()),
            workload=event.workload,
            ultraservers=tuple(sorted({g.ultraserver for g in held.grants})) if held else (),
            nodes=held.nodes if held else (),
        )
        if held is not None:
            DECISIONS.labels("released").inc()
            await self._sink.publish(
                released, msg_id=f"released-{event.workload.uid}-{released.request_id}"
            )
        return released


def _check(event: AllocationRequested, *, workload: str) -> None:
    """Refuse a request no decision can be made from, naming the field.

    Checked before any path (place, adopt, replace), since adopting takes the nodes as sent:
    a node named twice would be recorded as two units on one node, and a size out of range
    would cut the nodes into units no mode runs.
    """
    what = f"NeuronUltraServerWorkload {workload}"
    if not event.workload.uid:
        raise PlacementError(f"{what}: metadata.uid is empty")
    if event.topology_size not in TOPOLOGY_SIZES:
        sizes = ", ".join(str(s) for s in TOPOLOGY_SIZES)
        raise PlacementError(
            f"{what}: spec.topologySize {event.topology_size} is not one of {sizes}"
        )
    if event.server_count < 1:
        raise PlacementError(f"{what}: spec.serverCount {event.server_count} must be at least 1")
    seen: set[str] = set()
    for index, node in enumerate(event.nodes):
        if not node:
            raise PlacementError(f"{what}: nodes[{index}] is empty")
        if node in seen:
            raise PlacementError(f"{what}: nodes names {node} twice")
        seen.add(node)


def _keys(exclude: Sequence[str]) -> frozenset[str]:
    """The UltraServers to avoid, by this allocator's key (the NeuronUltraServer name), given
    either that name or the raw server id the hardware reports."""
    out = set(exclude)
    for key in exclude:
        if key and not key.startswith("us-"):
            with contextlib.suppress(ValueError):  # no usable characters: no such server
                out.add(ultraserver_name(key))
    return frozenset(out)


def _decided(event: AllocationRequested, decision: Decision) -> AllocationDecided:
    allocation = decision.allocation
    if allocation is None:
        return AllocationDecided(
            request_id=event.request_id,
            workload=event.workload,
            granted=False,
            reason=decision.reason,
            generation=event.generation,
            topology_size=event.topology_size,
            refusals=decision.refusals,
        )
    return AllocationDecided(
        request_id=event.request_id,
        workload=event.workload,
        granted=True,
        ultraservers=tuple(dict.fromkeys(g.ultraserver for g in allocation.grants)),
        nodes=allocation.nodes,
        generation=allocation.generation,
        topology_size=allocation.size,
        grants=allocation.grants,
    )
