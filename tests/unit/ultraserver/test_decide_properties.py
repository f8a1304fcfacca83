"""The workload decider over random fleets and histories, without an API.

A small in-memory world performs the decided actions the way the executor does (statuses,
node records, templates, the finalizer) and answers allocator requests with the real
allocator (its placement and request handling, without the bus). Nodes go NotReady, are
declared lost by the failure detector (while Kubernetes still calls them Ready), come back, or
vanish; workloads are reconciled and deleted in any order. As on a cluster, the operator
knows an UltraServer by its raw server id (``us0``) and its NeuronUltraServer name
(``us-us0``), and the allocator by the name.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from neuron_dra_common.events import (
    AllocationDecided,
    AllocationReleased,
    AllocationRequested,
    Event,
    NodeLost,
    NodeRecovered,
    ObjectRef,
)
from neuron_dra_common.ultraserver import WORKLOAD_UID_LABEL, ultraserver_name
from neuron_dra_topology_allocator.allocator import Allocator
from neuron_dra_topology_allocator.projection import Projection
from neuron_dra_ultraserver_operator.actions import (
    Action,
    ApplyTemplate,
    DeleteTemplate,
    Emit,
    ForgetEvents,
    ListClaims,
    Release,
    RequestAllocation,
    Requeue,
    RetireTemplate,
    SetFinalizer,
    Together,
    WriteNodeRecords,
    WriteStatus,
    asks,
)
from neuron_dra_ultraserver_operator.decide import decide
from neuron_dra_ultraserver_operator.discovery import Member
from neuron_dra_ultraserver_operator.inputs import Facts, FleetView, Held
from neuron_dra_ultraserver_operator.manifests import selectors
from neuron_dra_ultraserver_operator.model import FINALIZER, TRACEPARENT, workload_from_api

Obj = dict[str, Any]
TYPE = "trn2u.48xlarge"
NOW = "2026-01-01T00:00:00Z"
WHEN = datetime(2026, 1, 1, tzinfo=UTC)
TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
STRATEGIES = ("NoOp", "RestartAll", "ReplaceAffected", "MigrateAffected")


class Sink:
    async def publish(self, event: Event, *, msg_id: str | None = None) -> Any:
        return None


class World:
    """Workloads, Nodes, templates and the allocator, changed only by decided actions."""

    def __init__(self, servers: int) -> None:
        self.servers = servers
        self.nodes = [f"us{u}-n{i}" for u in range(servers) for i in range(4)]
        self.ready: dict[str, bool] = dict.fromkeys(self.nodes, True)
        #: nodes the failure detector declared lost, with why
        self.lost: dict[str, str] = {}
        self.held: dict[str, Held] = {}
        self.workloads: dict[str, Obj] = {}
        self.templates: dict[str, Obj] = {}
        self.last_event: dict[str, tuple[str, str]] = {}
        projection = Projection()
        for node in self.nodes:
            u, i = node[2:].split("-n")
            projection.fleet.upsert_node(
                node,
                ultraserver=ultraserver_name(f"us{u}"),
                instance_type=TYPE,
                node_id=int(i),
                server_id_2=f"us{u}-p{int(i) // 2}",
            )
        projection.serving = True
        self.projection = projection
        self.allocator = Allocator(projection, sink=Sink())

    # --- what the operator sees --------------------------------------------------------------

    def fleet(self) -> FleetView:
        members = {
            n: Member(
                node_name=n,
                node_id=int(n.rsplit("-n", 1)[1]),
                server_id_2=f"{n.split('-')[0]}-p{int(n.rsplit('-n', 1)[1]) // 2}",
                healthy=ok,
            )
            for n, ok in self.ready.items()
        }
        return FleetView(
            members=members,
            names={n: ultraserver_name(n.split("-")[0]) for n in members},
            server_ids={n: n.split("-")[0] for n in members},
            servers={ultraserver_name(f"us{u}"): f"us{u}" for u in range(self.servers)},
            ready=dict(self.ready),
            failed=dict(self.lost),
        )

    def declare_lost(self, node: str) -> None:
        self.lost[node] = "lost"
        self.projection.apply(NodeLost(node=node, detected_at=WHEN))

    def declare_recovered(self, node: str) -> None:
        if self.lost.pop(node, None) is not None:
            self.projection.apply(NodeRecovered(node=node, detected_at=WHEN))

    def failed(self) -> set[str]:
        """Every node a placement must avoid: NotReady, gone, or declared lost."""
        return {n for n in self.nodes if not self.ready.get(n, False)} | set(self.lost)

    def ultraserver(self, node: str) -> str:
        return node.split("-")[0]

    def add(self, index: int, *, size: int, count: int, strategy: str) -> str:
        name = f"w{index}"
        self.workloads[f"ml/{name}"] = {
            "metadata": {
                "name": name,
                "namespace": "ml",
                "uid": f"uid-{index}",
                "generation": 1,
                "creationTimestamp": NOW,
                "finalizers": [],
            },
            "spec": {
                "instanceType": TYPE,
                "topologySize": size,
                "serverCount": count,
                "allocationPolicy": {"failureStrategy": strategy},
            },
        }
        return f"ml/{name}"

    def delete(self, key: str) -> None:
        obj = self.workloads.get(key)
        if obj is None:
            return
        if obj["metadata"]["finalizers"]:
            obj["metadata"]["deletionTimestamp"] = NOW
        else:
            del self.workloads[key]

    def state(self) -> Any:
        """Everything an action can change (Events aside: they are for people)."""
        return copy.deepcopy(
            (
                self.workloads,
                self.held,
                self.templates,
                [msgspec.to_builtins(a) for a in self.allocator.fleet.allocations()],
            )
        )

    # --- a pass --------------------------------------------------------------------------------

    async def reconcile(self, key: str) -> list[Action]:
        """One pass over ``key``, as the reconciler runs it; the actions performed."""
        obj = self.workloads.get(key)
        if obj is None:
            return []
        workload = workload_from_api(copy.deepcopy(obj))
        facts = Facts(now=NOW, traceparent=TRACE)
        performed: list[Action] = []
        for _ in range(4):
            actions = decide(workload, self.fleet(), dict(self.held), facts)
            performed += actions
            for action in actions:
                facts = await self.perform(key, obj, action, facts)
            if not asks(actions):
                break
        return performed

    async def perform(self, key: str, obj: Obj, action: Action, facts: Facts) -> Facts:
        """Perform ``action`` for the workload ``obj`` (still the stored one until it goes)."""
        meta = obj["metadata"]
        ref = ObjectRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])
        match action:
            case RequestAllocation():
                answer = await self.allocator.handle(
                    AllocationRequested(
                        request_id=f"{ref.uid}-1",
                        workload=ref,
                        topology_size=obj["spec"]["topologySize"],
                        server_count=obj["spec"]["serverCount"],
                        instance_type=TYPE,
                        generation=1,
                        nodes=action.nodes,
                        exclude_ultraservers=action.exclude,
                    )
                )
                assert isinstance(answer, AllocationDecided)
                if action.purpose == "replace":
                    return msgspec.structs.replace(facts, replacement=answer)
                if action.purpose != "hold":
                    return msgspec.structs.replace(facts, answer=answer)
            case Release():
                if meta.get("deletionTimestamp"):
                    # A deleted workload lets go of its nodes in Kubernetes before the
                    # allocator may hand them to another: no status or record names them.
                    assert not (obj.get("status") or {}).get("allocations"), obj["status"]
                    assert not [n for n, h in self.held.items() if h.record.workload_uid == ref.uid]
                await self.allocator.handle(
                    AllocationReleased(request_id=f"release-{ref.uid}", workload=ref)
                )
            case WriteStatus():
                obj["status"] = copy.deepcopy(action.status)
            case WriteNodeRecords():
                for write in action.writes:
                    if write.node not in self.ready:
                        continue  # gone: the patch answers 404
                    if write.record is None:
                        self.held.pop(write.node, None)
                    else:
                        before = self.held.get(write.node)
                        trace = write.traceparent or (before.traceparent if before else "")
                        self.held[write.node] = Held(record=write.record, traceparent=trace)
            case Together():
                for inner in action.actions:
                    facts = await self.perform(key, obj, inner, facts)
            case ApplyTemplate():
                self.templates[f"ml/{action.template['metadata']['name']}"] = action.template
            case RetireTemplate():
                name = f"ml/{action.template['metadata']['name']}"
                template = self.templates.get(name)
                if (
                    template
                    and template["metadata"]["labels"][WORKLOAD_UID_LABEL] == ref.uid
                    and selectors(template) != selectors(action.template)
                ):
                    del self.templates[name]
            case DeleteTemplate():
                template = self.templates.get(f"ml/{action.name}")
                if template and template["metadata"]["labels"][WORKLOAD_UID_LABEL] == ref.uid:
                    del self.templates[f"ml/{action.name}"]
            case ListClaims():
                return msgspec.structs.replace(facts, claims=())
            case SetFinalizer():
                meta["finalizers"] = [FINALIZER] if action.present else []
                if not action.present and meta.get("deletionTimestamp"):
                    del self.workloads[key]
            case Emit():
                self.last_event[ref.uid] = (action.reason, action.message)
            case ForgetEvents():
                self.last_event.pop(ref.uid, None)
            case _:
                pass  # queue hooks: the history below reconciles every workload anyway
        return facts


def repeated(world: World, key: str, action: Action) -> bool:
    """Whether ``action`` only says again what holds already: a confirmation of the nodes
    held, the template as it is, the last Event (the executor sends it once); or, for a
    workload that waits for room, another try a while later."""
    obj = world.workloads[key]
    waits = status_of(world, key).get("state") == "Pending"
    match action:
        case RequestAllocation():
            if action.purpose == "place":
                return waits
            return action.purpose == "confirm" and action.nodes == tuple(
                nodes_of(status_of(world, key))
            )
        case Requeue():
            return waits
        case ApplyTemplate():
            return world.templates.get(f"ml/{action.template['metadata']['name']}") == (
                action.template
            )
        case Emit():
            return world.last_event.get(obj["metadata"]["uid"]) == (action.reason, action.message)
    return False


def status_of(world: World, key: str) -> Obj:
    status: Obj = world.workloads[key].get("status") or {}
    return status


def nodes_of(status: Obj) -> list[str]:
    return [n["nodeName"] for a in status.get("allocations") or () for n in a["nodes"]]


# --- histories ----------------------------------------------------------------------------------

shapes = st.tuples(st.sampled_from((1, 2, 4)), st.integers(1, 2), st.sampled_from(STRATEGIES))
steps = st.one_of(
    st.tuples(st.just("pass"), st.integers(0, 2)),
    st.tuples(st.sampled_from(("fail", "lose", "declare", "recover")), st.integers(0, 15)),
    st.tuples(st.just("delete"), st.integers(0, 2)),
)


def check(world: World, replaced_from: dict[str, set[str]]) -> None:
    """What holds after every pass, for every workload."""
    owners: dict[str, str] = {}
    for key, obj in world.workloads.items():
        spec, status = obj["spec"], status_of(world, key)
        allocations = status.get("allocations") or ()
        assert len(allocations) <= spec["serverCount"], (key, status)
        assert len(status.get("allocatedUltraServers") or ()) <= spec["serverCount"]
        recorded = [
            n for n, h in world.held.items() if h.record.workload_uid == obj["metadata"]["uid"]
        ]
        assert len(recorded) <= spec["serverCount"] * spec["topologySize"], (key, recorded)
        # No node, hence no whole UltraServer, is held by two workloads.
        for node in nodes_of(status):
            assert owners.setdefault(node, key) == key, f"{node}: {owners[node]} and {key}"
    for key, avoided in replaced_from.items():
        if key in world.workloads:
            assert not avoided & set(nodes_of(status_of(world, key))), (key, avoided)


async def run(world: World, keys: Sequence[str], history: Sequence[tuple[str, int]]) -> None:
    for kind, arg in history:
        if kind == "pass":
            for key in keys[arg % len(keys)], *keys:
                replacing = key in world.workloads and world.workloads[key]["spec"][
                    "allocationPolicy"
                ]["failureStrategy"] in ("ReplaceAffected", "MigrateAffected")
                before = set(nodes_of(status_of(world, key))) if key in world.workloads else set()
                bad = before & world.failed()
                # A Node that is gone is unknown to the operator (its UltraServer too, if no
                # member is left): only the nodes it can see are checked for every placement.
                failed = world.failed() & set(world.ready)
                performed = await world.reconcile(key)
                after = set(nodes_of(status_of(world, key))) if key in world.workloads else set()
                new = after - before
                # A placement (first, again, or a replacement) never takes a failed node, nor
                # any node of an UltraServer where one failed: never the failed UltraServer again.
                sick = {world.ultraserver(n) for n in failed}
                assert not new & failed, (key, new, failed)
                assert not {world.ultraserver(n) for n in new} & sick, (key, new, sick)
                if replacing and any(
                    isinstance(a, Emit) and a.reason == "Replaced" for a in performed
                ):
                    assert not after & bad, (key, before, after, bad)
                    # The Event names the UltraServer given up and the one taken instead.
                    (message,) = [
                        a.message
                        for a in performed
                        if isinstance(a, Emit) and a.reason == "Replaced"
                    ]
                    for node in bad:
                        assert ultraserver_name(world.ultraserver(node)) in message, message
                    assert "with  " not in message, message
                    assert "UltraServer  " not in message, message
                check(world, {})
        elif kind == "delete":
            world.delete(keys[arg % len(keys)])
        else:
            node = world.nodes[arg % len(world.nodes)]
            if kind == "fail" and node in world.ready:
                world.ready[node] = False
            elif kind == "lose":  # the Node object goes, and the record on it
                world.ready.pop(node, None)
                world.held.pop(node, None)
                # Its heartbeats stop with it: the failure detector declares it lost.
                world.declare_lost(node)
            elif kind == "declare":  # the failure detector: lost, although still Ready
                world.declare_lost(node)
            elif kind == "recover":
                world.ready[node] = True
                world.declare_recovered(node)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    servers=st.integers(2, 4),
    shapes_=st.lists(shapes, min_size=1, max_size=3),
    history=st.lists(steps, max_size=14),
)
def test_passes_keep_the_invariants_and_a_settled_pass_changes_nothing(
    servers: int, shapes_: list[tuple[int, int, str]], history: list[tuple[str, int]]
) -> None:
    world = World(servers)
    keys = [
        world.add(i, size=size, count=count, strategy=strategy)
        for i, (size, count, strategy) in enumerate(shapes_)
    ]

    async def scenario() -> None:
        await run(world, keys, history)
        # Every node back: each workload settles, and then a pass over it changes nothing.
        for node in world.nodes:
            world.ready[node] = True
            world.declare_recovered(node)
        for _ in range(3):
            for key in keys:
                await world.reconcile(key)
        for key in keys:
            before = world.state()
            performed = await world.reconcile(key)
            assert world.state() == before, key
            assert [a for a in performed if not repeated(world, key, a)] == [], key
            check(world, {})

    asyncio.run(scenario())


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    servers=st.integers(2, 4),
    shapes_=st.lists(shapes, min_size=1, max_size=3),
    history=st.lists(steps, max_size=10),
)
def test_a_deleted_workload_lets_go_of_everything(
    servers: int, shapes_: list[tuple[int, int, str]], history: list[tuple[str, int]]
) -> None:
    world = World(servers)
    keys = [
        world.add(i, size=size, count=count, strategy=strategy)
        for i, (size, count, strategy) in enumerate(shapes_)
    ]

    async def scenario() -> None:
        await run(world, keys, history)
        for key in keys:
            uid = world.workloads[key]["metadata"]["uid"] if key in world.workloads else None
            world.delete(key)
            for _ in range(2):
                await world.reconcile(key)
            assert key not in world.workloads, status_of(world, key)
            if uid is None:
                continue
            assert not [n for n, h in world.held.items() if h.record.workload_uid == uid]
            assert world.allocator.fleet.allocation(uid) is None
            assert not [
                t
                for t in world.templates.values()
                if t["metadata"]["labels"][WORKLOAD_UID_LABEL] == uid
            ]
        assert world.allocator.fleet.allocations() == ()

    asyncio.run(scenario())


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    servers=st.integers(2, 4),
    shapes_=st.lists(shapes, min_size=1, max_size=3),
    history=st.lists(steps, max_size=12),
)
def test_with_failures_left_in_place_workloads_settle_without_flapping(
    servers: int, shapes_: list[tuple[int, int, str]], history: list[tuple[str, int]]
) -> None:
    """Whatever stays broken, a few passes settle every workload: after that a pass changes
    nothing (no Allocating -> Allocated -> Allocating loop, no UltraServer taken and given
    back), and a replacing workload that holds a failed node says why in its status."""
    world = World(servers)
    keys = [
        world.add(i, size=size, count=count, strategy=strategy)
        for i, (size, count, strategy) in enumerate(shapes_)
    ]

    async def scenario() -> None:
        await run(world, keys, history)
        for _ in range(4):
            for key in keys:
                await world.reconcile(key)
        for key in keys:
            if key not in world.workloads:
                continue
            before = world.state()
            performed = await world.reconcile(key)
            assert world.state() == before, key
            assert not [a for a in performed if isinstance(a, Emit) and a.reason == "Replaced"]
            status = status_of(world, key)
            strategy = world.workloads[key]["spec"]["allocationPolicy"]["failureStrategy"]
            held_failed = set(nodes_of(status)) & world.failed()
            if held_failed and strategy in ("ReplaceAffected", "MigrateAffected"):
                assert status["state"] == "PartiallyAllocated", status
                assert status["reason"] == "NoReplacement", status
            ready = [c for c in status.get("conditions") or () if c["type"] == "Ready"]
            if ready:
                assert (ready[0]["status"] == "True") == (status["state"] == "Allocated")

    asyncio.run(scenario())


def test_a_workload_that_finds_no_replacement_keeps_its_nodes_from_others() -> None:
    world = World(2)
    replacing = world.add(0, size=4, count=1, strategy="ReplaceAffected")
    pair = world.add(1, size=2, count=1, strategy="NoOp")
    waiting = world.add(2, size=4, count=1, strategy="NoOp")

    async def scenario() -> None:
        for key in (replacing, pair, waiting):
            await world.reconcile(key)
        assert status_of(world, waiting)["state"] == "Pending"
        held = nodes_of(status_of(world, replacing))
        world.ready[held[0]] = False
        await world.reconcile(replacing)  # no other UltraServer is free: nothing to replace
        status = status_of(world, replacing)
        assert status["state"] == "PartiallyAllocated"
        assert "no replacement" in status["message"]
        assert nodes_of(status) == held
        await world.reconcile(waiting)
        assert status_of(world, waiting)["state"] == "Pending"
        assert all(world.allocator.fleet.holder(n) == "uid-0" for n in held)
        check(world, {})

    asyncio.run(scenario())


def test_the_allocation_carries_the_trace_of_the_pass_that_made_it() -> None:
    world = World(2)
    key = world.add(0, size=4, count=1, strategy="NoOp")

    async def scenario() -> None:
        await world.reconcile(key)
        nodes = nodes_of(status_of(world, key))
        assert status_of(world, key)["state"] == "Allocated"
        assert {world.held[n].traceparent for n in nodes} == {TRACE}
        template = world.templates["ml/w0"]
        assert template["spec"]["metadata"]["annotations"] == {TRACEPARENT: TRACE}

    asyncio.run(scenario())
