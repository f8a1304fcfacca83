"""Failover at small N: the eks overlay's three NATS servers, the product's consumers running as
the stack runs them, a fleet of simulated node agents publishing at their own intervals, and
the server leading the streams killed with SIGKILL under that load.

What a user would see: the audit record holds every event the agents published, each once;
every consumer is handling messages again within 5 s of the kill; no node is declared lost.
The figures (each consumer's resume time, event latency through the failover) are printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import nats.errors
import pytest
from neuron_dra_cli.stack import alerting, health
from neuron_dra_common.bus import Bus, PublishError, replay
from neuron_dra_common.bus.declarations import AUDIT, CONSUMERS, HEALTH, HEARTBEAT
from neuron_dra_common.events import (
    ClaimPrepared,
    ClaimUnprepared,
    Event,
    NodeInventory,
    NodeLost,
    ObjectRef,
)
from neuron_dra_common.hardware.model import NodeHardware
from neuron_dra_common.liveness import Heartbeat

from bench.failover import handled, resumed
from bench.natscluster import lead_from, stream_leaders
from tests.fixtures.nats import REPO, NatsCluster
from tests.fixtures.subscribers import Alertmanager, ServiceProcess

NODES = 30
#: Discovery's heartbeat period on the stack (its kubelet's health checked each time).
HEARTBEAT_SECONDS = 1.0
#: A busy fleet: each node prepares or releases a claim every this many seconds.
CLAIM_SECONDS = 2.0
#: Load before the kill, and after it (well past the detector's 3 s window).
BEFORE_KILL = 6.0
AFTER_KILL = 12.0
#: The goal for every consumer to handle messages again after the kill.
RESUME_GOAL = 5.0
#: What NATS allows after a SIGKILL: a stream's or consumer's followers wait 4 to 9 s
#: (nats-server's Raft election timeout, fixed in server/raft.go) for a lost leader before
#: one campaigns (up to 0.8 s more); then a second for the push consumer to deliver again.
RESUME_BOUND = 11.0
#: The consumers of NEURON_AUDIT wait longer when its election ends before a source's: its
#: new leader asks each source's leader for a source consumer, a source still electing does
#: not answer, and nats-server waits 30 s for that answer (``srcConsumerWaitTime``) and then
#: 10 s more (its retry backoff after one failure) before asking again; none of it is a
#: setting. ``bench scale --failover`` prints each source's time (README "Sizing"): 46.5 s
#: for the three sources whose leaders came after the audit stream's. Nothing is lost meanwhile.
SOURCED_BOUND = 60.0


def overlay_replicas() -> int:
    """NEURON_DRA_STREAM_REPLICAS as the eks overlay sets it on every service and the Job."""
    text = (REPO / "deploy" / "kustomize" / "overlays" / "eks" / "kustomization.yaml").read_text()
    found = re.search(r"name: NEURON_DRA_STREAM_REPLICAS\s+value: \"(\d+)\"", text)
    assert found, "the eks overlay no longer sets NEURON_DRA_STREAM_REPLICAS"
    return int(found.group(1))


def trn2_hardware() -> NodeHardware:
    """A trn2.48xlarge as discovery reads it (the simulated node's files)."""
    from neuron_dra_common.hardware.node import read_node
    from neuron_dra_common.hardware.simulate import write_node

    with tempfile.TemporaryDirectory() as tmp:
        sim = write_node(Path(tmp), instance_type="trn2.48xlarge", node_name="failover")
        return read_node(sim.root, neuron_ls_command=sim.neuron_ls_command)


@dataclass
class Sent:
    """One audited event an agent published: when the publish began and when it was stored."""

    node: str
    began: float
    stored: float = 0.0


@dataclass
class Fleet:
    """``NODES`` node agents, each on its own connection as each node's discovery and kubelet
    plugin are: the product's heartbeat, the node's inventory at start, claim events."""

    cluster: NatsCluster
    hardware: NodeHardware
    sent: dict[str, Sent] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    beats: list[Heartbeat] = field(default_factory=list)
    buses: list[Bus] = field(default_factory=list)

    async def run(self, index: int) -> None:
        node = f"trn2-{index:03d}"
        # Each agent picks its own server, as the client does from the Service's addresses.
        bus = await Bus.connect(random.sample(self.cluster.urls, 3), name=f"agent-{node}")
        self.buses.append(bus)
        publisher = bus.publisher(source=f"/neuron-dra/discovery/{node}")
        beat = Heartbeat(
            publisher=publisher, node=node, boot_id=f"boot-{node}", interval=HEARTBEAT_SECONDS
        )
        self.beats.append(beat)
        await asyncio.sleep(random.random() * CLAIM_SECONDS)  # agents are not in step
        beating = asyncio.create_task(beat.run(), name=f"heartbeat-{node}")

        async def send(event: Event, msg_id: str) -> None:
            record = self.sent[msg_id] = Sent(node=node, began=time.monotonic())
            try:
                await publisher.publish(event, msg_id=msg_id)
            except PublishError as exc:
                self.failed.append(f"{msg_id}: {exc}")
                return
            record.stored = time.monotonic()

        inventory = NodeInventory(
            node=node, boot_id=f"boot-{node}", generation=1, hardware=self.hardware
        )
        await send(inventory, f"inventory/{node}/1")
        claims: set[asyncio.Task[None]] = set()
        k = 0
        try:
            while True:
                k += 1
                claim = ObjectRef(namespace="ml", name=f"{node}-{(k + 1) // 2}")
                event: Event = (
                    ClaimPrepared(node=node, claim=claim, devices=("neurondevice0",))
                    if k % 2
                    else ClaimUnprepared(node=node, claim=claim, devices=("neurondevice0",))
                )
                # Claims keep coming whatever the bus does: a publish held up by the
                # election does not hold the next claim back.
                task = asyncio.create_task(send(event, f"claim/{node}/{k}"))
                claims.add(task)
                task.add_done_callback(claims.discard)
                await asyncio.sleep(CLAIM_SECONDS)
        finally:
            beat.stop()
            await beating
            for task in list(claims):
                await task


class Consumers:
    """Each service's handled-message count over time, read from its /metrics."""

    def __init__(self, services: dict[str, ServiceProcess]) -> None:
        # durable consumer -> the service that runs it
        self.ports = {
            durable: services[name].component.ports["http"]
            for durable, name in {
                "health-monitor-heartbeats": "failure-detector",
                "audit": "audit",
                "alert": "alerts",
            }.items()
        }
        self.samples: dict[str, list[tuple[float, float]]] = {d: [] for d in self.ports}

    @staticmethod
    def handled(port: int, durable: str) -> float | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as r:
                return handled(r.read().decode(), durable)
        except OSError:
            return None

    async def watch(self) -> None:
        while True:
            for durable, port in self.ports.items():
                count = await asyncio.to_thread(self.handled, port, durable)
                if count is not None:
                    self.samples[durable].append((time.monotonic(), count))
            await asyncio.sleep(0.1)

    def resumed(self, killed_at: float) -> dict[str, float]:
        """Seconds from the kill to each consumer's first message handled after it."""
        found = resumed(self.samples, killed_at)
        never = sorted(d for d, v in found.items() if v is None)
        assert not never, f"handled nothing after the kill: {never}"
        return {d: v for d, v in found.items() if v is not None}


class AuditFile:
    """The audit service's file, read as it grows: when each event's line appeared."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.ids: list[str] = []
        self.types: Counter[str] = Counter()
        self.seen: dict[str, float] = {}

    def read(self) -> None:
        if not self.path.exists():
            return
        with self.path.open("rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        now = time.monotonic()
        for raw in complete.splitlines():
            line = json.loads(raw)
            self.ids.append(line["id"])
            self.types[line["type"]] += 1
            self.seen.setdefault(line["id"], now)

    async def watch(self) -> None:
        while True:
            await asyncio.to_thread(self.read)
            await asyncio.sleep(0.05)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@pytest.fixture
def services(
    nats_cluster: NatsCluster, alertmanager: Alertmanager, tmp_path: Path
) -> Iterator[dict[str, ServiceProcess]]:
    """The declare step, then the failure detector, the audit and the alerts services, each
    with every server's address and the overlay's stream replication, as the stack runs them
    (the detector without the Kubernetes API: it only publishes on the bus)."""
    env = {**nats_cluster.open_env, "NEURON_DRA_STREAM_REPLICAS": str(overlay_replicas())}
    declared = subprocess.run(
        [sys.executable, "-m", "neuron_dra_bus_auth.declare"],
        env={**os.environ, **env, "NEURON_DRA_WAIT_SECONDS": "30"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert declared.returncode == 0, declared.stderr[-3000:]
    [detector] = health.health_components(
        nats_url=env["NEURON_DRA_NATS_SERVERS"], kubeconfig=tmp_path / "no-kubeconfig"
    )
    detector.env["NEURON_DRA_KUBERNETES"] = "false"
    audit, alerts = alerting.subscriber_components(
        nats_url=env["NEURON_DRA_NATS_SERVERS"],
        state_dir=tmp_path,
        alertmanager_url=alertmanager.url,
    )
    running: dict[str, ServiceProcess] = {}
    try:
        for component in (detector, audit, alerts):
            component.env.update(env)
            service = running[component.name] = ServiceProcess(
                component, log=tmp_path / f"{component.name}.log"
            )
            service.start(wait_ready=False)
        for service in running.values():
            service.wait_ready(timeout=90)
        yield running
    finally:
        for service in running.values():
            service.stop()


async def test_killing_the_server_leading_the_streams_loses_no_event_and_stalls_no_consumer(
    nats_cluster: NatsCluster,
    services: dict[str, ServiceProcess],
    alertmanager: Alertmanager,
    tmp_path: Path,
) -> None:
    bus = await Bus.connect(nats_cluster.urls, name="test")
    fleet = Fleet(cluster=nats_cluster, hardware=trn2_hardware())
    consumers = Consumers(services)
    audit = AuditFile(alerting.audit_file(tmp_path))
    watchers = [
        asyncio.create_task(consumers.watch(), name="watch-consumers"),
        asyncio.create_task(audit.watch(), name="watch-audit"),
    ]
    # One server leads every stream and every consumer the services run: the worst server
    # to lose. Which one JetStream reports (the heartbeats' leader, moved to as the others).
    victim = (await stream_leaders(bus))[HEARTBEAT.name]
    await lead_from(bus, victim, list(consumers.ports))
    agents = [asyncio.create_task(fleet.run(i), name=f"agent-{i}") for i in range(NODES)]
    try:
        await asyncio.sleep(BEFORE_KILL)
        leaders = await stream_leaders(bus)
        led = sorted(name for name, server in leaders.items() if server == victim)
        assert {HEARTBEAT.name, AUDIT.name, *consumers.ports} <= set(led), leaders
        killed_at = time.monotonic()
        await asyncio.to_thread(nats_cluster.servers[victim].kill)
        await asyncio.sleep(AFTER_KILL)
    finally:
        for task in agents:
            task.cancel()
        for task in agents:
            with contextlib.suppress(asyncio.CancelledError):
                await task
    stopped_at = time.monotonic()
    try:
        # Every event stored reaches the audit file: the consumers catch up, then a little
        # longer for a duplicate to show.
        stored = {msg_id for msg_id, s in fleet.sent.items() if s.stored}
        for _ in range(int(SOURCED_BOUND / 0.2)):
            if stored <= set(audit.ids):
                break
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.5)
        await asyncio.to_thread(audit.read)
        lost_events = [e for e in await _node_events(bus) if isinstance(e, NodeLost)]
        firing = alertmanager.active()
        new_leaders = await stream_leaders(bus)
    finally:
        for task in watchers:
            task.cancel()
        for task in watchers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for agent_bus in fleet.buses:
            with contextlib.suppress(Exception):
                await agent_bus.close()
        await bus.close()

    resumed = consumers.resumed(killed_at)
    window = [s for s in fleet.sent.values() if killed_at - 1 <= s.began <= killed_at + RESUME_GOAL]
    to_audit = [
        audit.seen[msg_id] - s.began for msg_id, s in fleet.sent.items() if msg_id in audit.seen
    ]
    in_failover = [
        audit.seen[msg_id] - s.began
        for msg_id, s in fleet.sent.items()
        if msg_id in audit.seen and s in window
    ]
    stored_in_failover = [s.stored - s.began for s in window if s.stored]
    beats = [b.sent for b in fleet.beats]
    figures = {
        "nodes": NODES,
        "killed": victim,
        "it_led": led,
        "new_leaders": sorted({new_leaders[n] for n in led if n in new_leaders}),
        "resume_seconds": {d: round(v, 2) for d, v in sorted(resumed.items())},
        "resumed_within_goal": sorted(d for d, v in resumed.items() if v <= RESUME_GOAL),
        "events_published": len(fleet.sent),
        "events_audited": len(audit.ids),
        "latency_to_audit_p50_p99": [
            round(percentile(to_audit, 0.5), 3),
            round(percentile(to_audit, 0.99), 3),
        ],
        "failover_latency_to_audit_p50_p99": [
            round(percentile(in_failover, 0.5), 3),
            round(percentile(in_failover, 0.99), 3),
        ],
        "failover_publish_p50_p99": [
            round(percentile(stored_in_failover, 0.5), 3),
            round(percentile(stored_in_failover, 0.99), 3),
        ],
        "failover_events": len(window),
        "heartbeats_sent": sum(beats),
        "seconds_under_load": round(stopped_at - killed_at + BEFORE_KILL, 1),
    }
    print("failover figures: " + json.dumps(figures))

    # No event lost, none written twice: every publish the agents made was stored (retried
    # across the leader change with its own msg id, which JetStream de-duplicates), and the
    # audit record holds each exactly once.
    assert not fleet.failed, fleet.failed[:5]
    published = set(fleet.sent)
    missing = published - set(audit.ids)
    assert not missing, f"{len(missing)} events missing from the audit: {sorted(missing)[:5]}"
    twice = [i for i, n in Counter(audit.ids).items() if n > 1]
    assert not twice, f"{len(twice)} events audited twice: {twice[:5]}"
    assert set(audit.ids) == published, sorted(set(audit.ids) - published)[:5]
    assert len(window) >= NODES, "too few events published around the kill to judge"
    # Every consumer handles messages again once NATS has elected its new leaders.
    bound = {
        d: SOURCED_BOUND if CONSUMERS[d].stream == AUDIT.name else RESUME_BOUND for d in resumed
    }
    slow = {d: round(v, 1) for d, v in resumed.items() if v > bound[d]}
    assert not slow, f"consumers not handling messages within {bound} s of the kill: {slow}"
    # Nobody lost: no NodeLost on the bus, no alert firing, every node kept beating.
    assert not lost_events, [msgspec.structs.asdict(e) for e in lost_events][:5]
    assert not firing, firing
    assert audit.types["com.aws.neuron.node.lost.v1"] == 0
    assert victim not in figures["new_leaders"]  # type: ignore[operator]


async def _node_events(bus: Bus) -> list[Event]:
    """What the health stream holds, read as ``neuron-dra events`` reads it; asked again while
    the cluster still places the reader (a consumer placed on the killed server times out)."""
    for _ in range(5):
        try:
            found = await replay(
                bus, name="test-reader", stream=HEALTH.name, subject="neuron.health.>"
            )
            return list(found)
        except nats.errors.TimeoutError:
            await asyncio.sleep(1)
    raise AssertionError("the health stream could not be read after the failover")
