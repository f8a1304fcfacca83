"""Fuzzing the allocator's requests: any field out of range, unknown or repeated nodes.

Whatever a request carries, the allocator answers it or refuses it with a ``ValueError`` that
names the workload and field (the responder turns it into an error reply and a dead letter);
nothing else escapes, and no node is ever held by two workloads.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from neuron_dra_common.bus import PublishResult
from neuron_dra_common.events import (
    AllocationDecided,
    AllocationReleased,
    AllocationRequested,
    Event,
    NodeInventory,
    ObjectRef,
)
from neuron_dra_common.hardware.model import NodeHardware, UltraServerInfo
from neuron_dra_topology_allocator.allocator import Allocator
from neuron_dra_topology_allocator.projection import Projection

TYPE = "trn2u.48xlarge"
SERVERS = 3


class Recorded:
    """The bus the allocator records its decisions on, as a list."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    async def publish(self, event: Event, *, msg_id: str | None = None) -> PublishResult:
        self.events.append(event)
        return PublishResult(
            msg_id=msg_id or "", stream="NEURON_ALLOCATION", sequence=len(self.events)
        )


def inventory(us: int, node: int) -> NodeInventory:
    return NodeInventory(
        node=f"us{us}-n{node}",
        boot_id="boot",
        generation=1,
        observed_at=datetime.now(UTC),
        hardware=NodeHardware(
            instance_type=TYPE,
            ultraserver=UltraServerInfo(
                server_id_4=f"{us + 1:016x}",
                server_id_2=f"{us + 1:014x}p{node // 2}",
                node_id_4=node,
                node_id_2=node % 2,
                supported_modes=(1, 2, 3, 4),
            ),
        ),
    )


NODES = [f"us{u}-n{n}" for u in range(SERVERS) for n in range(4)]
uids = st.sampled_from(["u1", "u2", "u3", "u4", ""])
workloads = st.builds(
    ObjectRef,
    namespace=st.sampled_from(["ml", "", "a.b"]),
    name=st.sampled_from(["train", "serve", ""]),
    uid=uids,
)
requested = st.builds(
    AllocationRequested,
    request_id=st.text(max_size=4),
    workload=workloads,
    topology_size=st.integers(-2, 8),
    server_count=st.integers(-1, 4),
    instance_type=st.sampled_from([TYPE, "", "trn2.48xlarge", "p5.48xlarge"]),
    ultraserver_mode=st.none() | st.integers(-1, 5),
    exclude_ultraservers=st.lists(st.sampled_from(["us-1", "0000000000000002", "", "?"])).map(
        tuple
    ),
    generation=st.integers(-1, 3),
    nodes=st.lists(st.sampled_from([*NODES, "unknown-node", ""]), max_size=9).map(tuple),
)
released = st.builds(
    AllocationReleased,
    request_id=st.text(max_size=4),
    workload=workloads,
    nodes=st.lists(st.sampled_from(NODES), max_size=4).map(tuple),
)


def _holders(allocator: Allocator) -> dict[str, str]:
    """Node -> the UID holding it; fails if two workloads hold one node."""
    held: dict[str, str] = {}
    for allocation in allocator.fleet.allocations():
        for node in allocation.nodes:
            other = held.setdefault(node, allocation.uid)
            assert other == allocation.uid, f"{node} held by {other} and {allocation.uid}"
    return held


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=st.lists(st.one_of(requested, released), min_size=1, max_size=12))
def test_any_request_is_answered_or_refused_naming_the_field_and_no_node_is_held_twice(
    requests: list[AllocationRequested | AllocationReleased],
) -> None:
    projection = Projection()
    for us in range(SERVERS):
        for node in range(4):
            projection.apply(inventory(us, node))
    projection.serving = True
    sink = Recorded()
    allocator = Allocator(projection, sink=sink)
    asyncio.run(_each(allocator, requests))


async def _each(
    allocator: Allocator, requests: list[AllocationRequested | AllocationReleased]
) -> None:
    for event in requests:
        try:
            answer = await allocator.handle(event)
        except ValueError as exc:
            message = str(exc)
            ref = event.workload
            assert f"{ref.namespace}/{ref.name}" in message, message
            assert any(f in message for f in ("spec.", "metadata.", "nodes")), message
        else:
            expected = (
                AllocationDecided
                if isinstance(event, AllocationRequested)
                else (AllocationReleased)
            )
            assert isinstance(answer, expected)
            if isinstance(answer, AllocationDecided) and answer.granted:
                assert event.workload.uid, "granted to a workload without a UID"
                assert len(set(answer.nodes)) == len(answer.nodes), answer.nodes
        _holders(allocator)


@pytest.mark.parametrize("nodes", [("us0-n0", "us0-n0"), ("us0-n0", "us0-n1", "us0-n1")])
def test_a_request_that_names_one_node_twice_is_refused(nodes: tuple[str, ...]) -> None:
    projection = Projection()
    for node in range(4):
        projection.apply(inventory(0, node))
    projection.serving = True
    allocator = Allocator(projection, sink=Recorded())
    request = AllocationRequested(
        request_id="r",
        workload=ObjectRef(namespace="ml", name="train", uid="u1"),
        topology_size=2,
        nodes=nodes,
    )
    with pytest.raises(ValueError, match="ml/train: nodes names us0-n"):
        asyncio.run(allocator.handle(request))
