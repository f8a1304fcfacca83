"""The NATS server leading the streams killed with SIGKILL in the middle of a scale run.

Before the kill every stream and every durable consumer the run's services use is moved to
one server (JetStream's leader step-down with a preferred server): the worst server to lose.
From the kill on, this records what a user would see:

* each consumer's **resume time**: from the kill to the first message its service handled
  after it (the service's ``neuron_dra_bus_messages_total`` read every 0.2 s);
* when each stream and consumer it led had a **new leader** (JetStream's info API), and when
  each source of the audit stream was read again (its ``active``: time since the stream last
  heard from that source);
* **the audit reconciles**: every claim event the bench and the simulated agents published and
  the server acknowledged is in the audit file exactly once, and how long after the kill that
  held. Inventories are counted apart: the inventory stream keeps the newest per node, so one
  replaced while the audit stream's source was not reading it is gone before the audit reads
  it (the probe's inventories, all of one node, show how many).

A probe publishes an inventory and a claim event every half second through the failover, so
every consumer has something to handle. The killed server is started again afterwards, as its
StatefulSet would restart the pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from neuron_dra_common.bus import Bus
from neuron_dra_common.bus.declarations import AUDIT, CONSUMERS, HEARTBEAT, STREAMS
from neuron_dra_common.events import ClaimPrepared, Event, NodeInventory, ObjectRef
from prometheus_client.parser import text_string_to_metric_families

from bench.natscluster import NatsCluster, lead_from, stream_leaders

__all__ = [
    "CONSUMER_SERVICES",
    "RESUME_GOAL_S",
    "Failover",
    "FailoverFigures",
    "audit_reconciles",
    "handled",
    "resumed",
]

#: The durable consumers the scale run's services run, and the service running each.
CONSUMER_SERVICES = {
    "slice-publisher-inventory": "slice-publisher",
    "slice-publisher-health": "slice-publisher",
    "health-monitor-heartbeats": "failure-detector",
    "audit": "audit",
}
#: The issue's goal: every consumer handles messages again within this of the kill.
RESUME_GOAL_S = 5.0
SAMPLE_SECONDS = 0.2
PROBE_SECONDS = 0.5
#: A source of the audit stream counts as read again once it was heard from this recently.
SOURCE_ACTIVE_NS = 2_000_000_000
_STREAMS = {s.name for s in STREAMS}


# --- pure pieces (unit tested) ---------------------------------------------------------------


def handled(metrics: str, durable: str) -> float:
    """Messages the consumer ``durable`` handled, from a service's ``/metrics``."""
    return sum(
        s.value
        for family in text_string_to_metric_families(metrics)
        if family.name == "neuron_dra_bus_messages"
        for s in family.samples
        if s.name.endswith("_total") and s.labels.get("consumer") == durable
    )


def resumed(
    samples: Mapping[str, Iterable[tuple[float, float]]], killed_at: float
) -> dict[str, float | None]:
    """Seconds from the kill to each consumer's first message handled after it (None: none).

    ``samples`` are (time, messages handled so far) per consumer. The count at the first
    reading at least one sample period after the kill stands for what was handled before it
    (a message in hand at the kill is not a resume); the first reading above it is the next.

    >>> resumed({"audit": [(9.0, 5), (10.3, 6), (10.5, 6), (16.0, 6), (16.2, 9)]}, 10.0)
    {'audit': 6.2}
    """
    found: dict[str, float | None] = {}
    for durable, points in samples.items():
        after = [(t, n) for t, n in points if t >= killed_at + SAMPLE_SECONDS]
        if not after:
            found[durable] = None
            continue
        base = after[0][1]
        first = next((t for t, n in after if n > base), None)
        found[durable] = None if first is None else round(first - killed_at, 3)
    return found


def audit_reconciles(
    published: Iterable[str], audited: Iterable[str]
) -> tuple[list[str], list[str]]:
    """(published ids missing from the audit, ids the audit holds more than once).

    >>> audit_reconciles(["a", "b", "c"], ["a", "c", "c", "x"])
    (['b'], ['c'])
    """
    counts = Counter(audited)
    missing = sorted(set(published) - set(counts))
    twice = sorted(i for i, n in counts.items() if n > 1)
    return missing, twice


def audit_ids(path: Path) -> list[str]:
    """The event ids of the audit file, in the order written."""
    if not path.exists():
        return []
    ids = []
    for raw in path.read_bytes().splitlines():
        with contextlib.suppress(ValueError):
            ids.append(str(json.loads(raw)["id"]))
    return ids


# --- the run ---------------------------------------------------------------------------------


@dataclass
class FailoverFigures:
    killed: str = ""
    led: list[str] = field(default_factory=list)
    resume_s: dict[str, float | None] = field(default_factory=dict)
    elected_s: dict[str, float] = field(default_factory=dict)
    audit_sources_s: dict[str, float] = field(default_factory=dict)
    audit_caught_up_s: float | None = None
    published: int = 0
    missing: list[str] = field(default_factory=list)
    twice: list[str] = field(default_factory=list)
    probes_failed: int = 0
    #: The probe's inventories, and those the audit never saw: the inventory stream keeps
    #: one message per node, so one replaced before the audit stream's source read it again
    #: is not there to be read.
    inventories: int = 0
    inventories_superseded: int = 0

    def resumed_within_goal(self) -> bool:
        return all(v is not None and v <= RESUME_GOAL_S for v in self.resume_s.values())

    def nothing_lost(self) -> bool:
        return not self.missing and not self.twice and not self.probes_failed

    def as_json(self) -> dict[str, Any]:
        return {
            "killed": self.killed,
            "led": self.led,
            "resume_s": self.resume_s,
            "new_leader_s": self.elected_s,
            "audit_sources_read_again_s": self.audit_sources_s,
            "audit_caught_up_s": self.audit_caught_up_s,
            "events_reconciled": self.published,
            "missing": len(self.missing),
            "audited_twice": len(self.twice),
            "probe_publishes_failed": self.probes_failed,
            "probe_inventories": self.inventories,
            "probe_inventories_superseded_unaudited": self.inventories_superseded,
        }


class Failover:
    """Arm (move every leader to one server, start watching), kill it, then finish."""

    def __init__(
        self,
        *,
        bus: Bus,
        cluster: NatsCluster,
        ports: Mapping[str, int],
        audit_file: Path,
        probe_node: NodeInventory,
    ) -> None:
        self.bus = bus
        self.cluster = cluster
        self.ports = {d: ports[s] for d, s in CONSUMER_SERVICES.items() if s in ports}
        self.audit_file = audit_file
        self.probe_node = probe_node
        self.figures = FailoverFigures()
        self.killed_at = 0.0
        self._samples: dict[str, list[tuple[float, float]]] = {d: [] for d in self.ports}
        self._tasks: list[asyncio.Task[None]] = []
        self._probe_task: asyncio.Task[None] | None = None
        self._probes: set[asyncio.Task[None]] = set()
        self._probe_ids: list[str] = []
        self._inventory_ids: list[str] = []

    async def arm(self) -> str:
        """Move every leader to the heartbeats' leader; start reading the consumers."""
        victim = (await stream_leaders(self.bus))[HEARTBEAT.name]
        await lead_from(self.bus, victim, list(self.ports))
        self.figures.killed = victim
        self.figures.led = sorted(
            n for n, s in (await stream_leaders(self.bus)).items() if s == victim
        )
        self._tasks.append(asyncio.create_task(self._sample(), name="failover consumers"))
        await asyncio.sleep(1.0)
        return victim

    async def kill(self) -> None:
        self.killed_at = time.monotonic()
        await asyncio.to_thread(self.cluster.kill, self.figures.killed)
        self._tasks.append(asyncio.create_task(self._elections(), name="failover elections"))
        self._probe_task = asyncio.create_task(self._probe(), name="failover probe")

    async def finish(self, published: Iterable[str], *, wait: float = 120.0) -> FailoverFigures:
        """Stop the probe, wait (up to ``wait``) for the audit to hold every acknowledged
        event, start the killed server again and return the figures."""
        if self._probe_task is not None:
            self._probe_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe_task
        for task in list(self._probes):
            with contextlib.suppress(Exception):
                await task
        known = {*published, *self._probe_ids}
        f = self.figures
        f.inventories = len(self._inventory_ids)
        f.published = len(known)
        deadline = time.monotonic() + wait
        while True:
            ids = await asyncio.to_thread(audit_ids, self.audit_file)
            f.missing, f.twice = audit_reconciles(known, ids)
            f.inventories_superseded = len(set(self._inventory_ids) - set(ids))
            if not f.missing:
                f.audit_caught_up_s = round(time.monotonic() - self.killed_at, 1)
                break
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        f.resume_s = resumed(self._samples, self.killed_at)
        await asyncio.to_thread(self.cluster.restart, f.killed)
        return f

    async def _sample(self) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.0)) as session:
            while True:
                for durable, port in self.ports.items():
                    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                        async with session.get(f"http://127.0.0.1:{port}/metrics") as answer:
                            text = await answer.text()
                        self._samples[durable].append((time.monotonic(), handled(text, durable)))
                await asyncio.sleep(SAMPLE_SECONDS)

    async def _info(self, subject: str) -> dict[str, Any]:
        with contextlib.suppress(Exception):  # no leader to answer yet
            answer = await self.bus.nc.request(subject, b"", timeout=0.5)
            found: dict[str, Any] = json.loads(answer.data)
            return found
        return {}

    async def _elections(self) -> None:
        """When each thing the killed server led has a new leader, and when each of the audit
        stream's sources is read again."""
        subjects = {
            name: f"$JS.API.STREAM.INFO.{name}" for name in self.figures.led if name in _STREAMS
        } | {
            name: f"$JS.API.CONSUMER.INFO.{CONSUMERS[name].stream}.{name}"
            for name in self.figures.led
            if name in CONSUMERS
        }
        victim = self.figures.killed
        while True:
            names = list(subjects)
            answers = await asyncio.gather(*(self._info(subjects[n]) for n in names))
            now = round(time.monotonic() - self.killed_at, 2)
            for name, info in zip(names, answers, strict=True):
                leader = (info.get("cluster") or {}).get("leader")
                if leader and leader != victim:
                    self.figures.elected_s.setdefault(name, now)
                if name == AUDIT.name and leader and leader != victim:
                    for source in info.get("sources") or ():
                        active = source.get("active")
                        if isinstance(active, int) and 0 <= active < SOURCE_ACTIVE_NS:
                            self.figures.audit_sources_s.setdefault(str(source["name"]), now)
            await asyncio.sleep(0.25)

    async def _probe(self) -> None:
        """An inventory and a claim event every half second, each publish in a task of its
        own (one held up by the election does not hold the next back)."""
        publisher = self.bus.publisher(source="/bench/scale/failover")
        node = self.probe_node.node

        async def send(event: Event, msg_id: str) -> None:
            try:
                await publisher.publish(event, msg_id=msg_id)
            except Exception:
                self.figures.probes_failed += 1
                return
            (self._inventory_ids if isinstance(event, NodeInventory) else self._probe_ids).append(
                msg_id
            )

        k = 0
        while True:
            k += 1
            claim = ObjectRef(namespace="bench-failover", name=f"probe-{k}", uid=f"probe-{k}")
            for event, msg_id in (
                (self.probe_node, f"failover/inventory/{node}/{k}"),
                (ClaimPrepared(node=node, claim=claim, devices=()), f"failover/claim/{k}"),
            ):
                task = asyncio.create_task(send(event, msg_id))
                self._probes.add(task)
                task.add_done_callback(self._probes.discard)
            await asyncio.sleep(PROBE_SECONDS)
