"""Fleet scale: N simulated trn2u nodes on the real control plane and a three-server NATS
cluster, with the product's cluster services as processes, measured end to end.

For each N (``--nodes``, several allowed; ``--quick``: 100), afresh:

* **servers**: etcd, kube-apiserver, kube-controller-manager and kube-scheduler from the
  cached Kubernetes build (``bench.control_plane``); three NATS servers configured from the
  eks overlay's ``nats.conf`` (``bench.natscluster``), every stream with three copies
  (``NEURON_DRA_STREAM_REPLICAS=3``, as the overlay sets it); the local overlay's cluster
  objects (namespace, DeviceClass, CRDs) applied with kubectl.
* **fleet**: N trn2u.48xlarge nodes, N/4 UltraServers (``bench.fleetsim``): the bench
  keeps their Nodes and Leases as their kubelets would and publishes their inventories; one
  child process sends a heartbeat per node per second and a trickle of claim events as their
  agents would.
* **services**: the slice publisher, the failure detector, the topology allocator, the
  UltraServer operator and the audit service, each ``python -m`` as ``dev up`` starts them,
  with the settings it gives them; with ``--publisher-replicas 2``, two slice publishers
  sharing the nodes (``NEURON_DRA_PARTITIONS=2``).

Then, timed:

1. **slices from cold**: before the publisher starts, a bare kubernetes-asyncio loop writes
   every node's slices (``bench/bare/slices_bare.py``, 16 in flight), and they are deleted;
   then every NodeInventory is published and the publisher writes the same slices. Wall
   time, the apiserver's slice writes (its ``apiserver_request_total``), the publisher's CPU
   and peak RSS.
2. **device fault -> taint**: an uncorrectable DeviceHealthChanged on one device of one node,
   until the publisher's DeviceTaintChanged (published once the pool carrying the taint is
   written); then the repair.
3. **workloads**: min(100, N/4) NeuronUltraServerWorkloads of one 4-node UltraServer each,
   created at once, until each is ``Allocated``; apiserver writes per workload (every
   mutating request but Leases and Node status, less the workload's own create).
4. **silent node -> lost**: the heartbeats of several nodes stop (a little apart), until the
   detector's NodeLost, timed from the server's ack of each node's last heartbeat.
5. **steady state**: each service's CPU per second while only the fleet's own traffic flows;
   then each service's peak RSS (``VmHWM``).

With ``--failover``, after those: the NATS server leading every stream is killed with
SIGKILL while 100 workloads are being allocated, and the faults and silent nodes of 2. and 4.
run again through the failover (``bench.failover``): each figure is printed next to its steady
twin, with each consumer's resume time and whether the audit reconciles. With ``--chaos``,
last: the chaos checks against the whole fleet after a churn (``chaos.scale``).

Progress (each phase, and how far a long one got) goes to stderr; the report to stdout.

What differs from the stack: the bus is open (``NEURON_DRA_INSECURE_BUS=1``, no auth callout
and no TLS, between the NATS servers neither); every service uses the admin kubeconfig rather
than its own ServiceAccount; the alert subscriber and Alertmanager do not run.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import ssl
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
from neuron_dra_cli.stack import components as comp
from neuron_dra_cli.stack import process, services
from neuron_dra_cli.stack.alerting import audit_file
from neuron_dra_cli.stack.fleet import node_labels, parse_fleet
from neuron_dra_common.bus import Bus
from neuron_dra_common.bus.declarations import HEALTH, TAINTS
from neuron_dra_common.events import (
    AnyEvent,
    DeviceHealthChanged,
    DeviceTaintChanged,
    NodeInventory,
    NodeLost,
)
from neuron_dra_common.hardware.model import NodeHardware, UltraServerInfo
from neuron_dra_common.kube import RESOURCE_SLICES, KubeClient, connect
from neuron_dra_common.ultraserver import GROUP
from neuron_dra_common.ultraserver import NAMESPACE as US_NAMESPACE
from neuron_dra_ultraserver_operator.resources import NAMESPACES, NUS, NUSW
from prometheus_client.parser import text_string_to_metric_families

from bench import baseline_env
from bench.control_plane import ControlPlane, control_plane
from bench.failover import Failover, FailoverFigures
from bench.fleetsim import Agents, FleetSim
from bench.harness import Figure, Report, cpu_seconds, percentile
from bench.natscluster import NatsCluster, nats_cluster
from bench.progress import Progress, Tally
from bench.scenarios.ultraserver import NAMESPACE, VERSION, workload_body
from bench.watch import BusEvents
from chaos.scale import ChaosOutcome, ScaleChaos

Obj = dict[str, Any]

INSTANCE_TYPE = "trn2u.48xlarge"
QUICK_NODES = 100
#: The goals at fleet scale, judged at GOAL_NODES.
GOAL_NODES = 10_000
GOAL_LOST_P99_S = 5.0
GOAL_DETECTOR_CORES = 0.5
GOAL_SLICES_RATIO = 1.2
GOAL_WORKLOADS_S = 30.0
GOAL_RSS_MIB = 1024.0
WORKLOADS = 100
WORKERS = 16
MIB = 1024 * 1024
#: The cluster services, by the name their process runs under here.
SERVICES = (
    "slice-publisher",
    "failure-detector",
    "topology-allocator",
    "ultraserver-operator",
    "audit",
)
#: The apiserver counts a server-side apply as verb APPLY, not PATCH.
_MUTATING = ("POST", "PUT", "PATCH", "APPLY", "DELETE")


@dataclass(frozen=True)
class Sizes:
    nodes: int
    faults: int
    lost: int
    workloads: int
    steady_seconds: float
    #: ``--only workloads``: the fleet and its slices, then only the workloads part.
    only_workloads: bool = False
    #: Churn steps of ``--chaos`` (each followed by the checks that must hold at every step).
    chaos_steps: int = 30

    #: Slice publishers, each writing a share of the nodes (``partitions``).
    publisher_replicas: int = 1

    @classmethod
    def of(cls, nodes: int, *, quick: bool, only: str = "", publisher_replicas: int = 1) -> Sizes:
        if nodes < 4 or nodes % 4:
            raise ValueError(f"--nodes: {nodes} is not a positive multiple of 4 (UltraServers)")
        return cls(
            nodes=nodes,
            faults=5 if quick else 20,
            lost=5 if quick else 10,
            workloads=min(WORKLOADS, nodes // 4),
            steady_seconds=5.0 if quick else 20.0,
            only_workloads=only == "workloads",
            chaos_steps=6 if quick else 30,
            publisher_replicas=publisher_replicas,
        )


# --- pure pieces (unit tested) ---------------------------------------------------------------


def _write_samples(
    metrics: str, skip: Sequence[tuple[str, str]]
) -> Iterator[tuple[dict[str, str], str, str, float]]:
    """Each mutating ``apiserver_request_total`` sample as (labels, resource, subresource,
    count), less the ``(resource, subresource)`` pairs in ``skip`` (``""``: the object)."""
    for family in text_string_to_metric_families(metrics):
        if family.name != "apiserver_request":
            continue
        for sample in family.samples:
            labels = sample.labels
            if not sample.name.endswith("_total") or labels.get("verb") not in _MUTATING:
                continue
            resource, sub = labels.get("resource", ""), labels.get("subresource", "")
            if (resource, sub) not in skip:
                yield labels, resource, sub, sample.value


def apiserver_writes(
    metrics: str, *, only: Sequence[str] = (), skip: Sequence[tuple[str, str]] = ()
) -> float:
    """Mutating requests the apiserver answered, from its ``apiserver_request_total``:
    those on the resources in ``only`` (all when empty), less ``(resource, subresource)``
    pairs in ``skip`` (``""``: the object itself)."""
    return sum(
        (
            value
            for _, resource, _, value in _write_samples(metrics, skip)
            if not only or resource in only
        ),
        0.0,
    )


def apiserver_writes_by(metrics: str, *, skip: Sequence[tuple[str, str]] = ()) -> dict[str, float]:
    """Mutating requests the apiserver answered, by ``VERB resource[/subresource]``, with
    the answer's code when it was not a success (``PATCH nodes 409``)."""
    out: dict[str, float] = {}
    for labels, resource, sub, value in _write_samples(metrics, skip):
        code = labels.get("code", "")
        key = f"{labels['verb']} {resource}" + (f"/{sub}" if sub else "")
        key += "" if code.startswith("2") else f" {code}"
        out[key] = out.get(key, 0.0) + value
    return out


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident set (``VmHWM``), MiB; 0 when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def slope(points: Mapping[int, float]) -> tuple[float, float]:
    """Across the smallest and largest N: (MiB per 1,000 nodes, growth exponent), where an
    exponent of 1 is linear growth (``log(m2/m1) / log(n2/n1)``)."""
    if len(points) < 2:
        return float("nan"), float("nan")
    lo, hi = min(points), max(points)
    per_k = (points[hi] - points[lo]) * 1000.0 / (hi - lo)
    if points[lo] <= 0 or points[hi] <= 0:
        return per_k, float("nan")
    return per_k, math.log(points[hi] / points[lo]) / math.log(hi / lo)


def verdict(met: bool) -> str:
    return "met" if met else "NOT MET"


# --- one N -----------------------------------------------------------------------------------


@dataclass
class Measured:
    """What one N gave."""

    sizes: Sizes
    slices_s: float = 0.0
    bare_s: float = 0.0
    slice_writes: float = 0.0
    bare_writes: float = 0.0
    publisher_cpu_s: float = 0.0
    taint_s: list[float] = field(default_factory=list)
    lost_s: list[float] = field(default_factory=list)
    allocated_s: list[float] = field(default_factory=list)
    writes_per_workload: float = 0.0
    steady_cores: dict[str, float] = field(default_factory=dict)
    rss_mib: dict[str, float] = field(default_factory=dict)
    heartbeats_per_s: float = 0.0
    store_mib: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: With ``--failover``: what the failover showed, and the figures taken through it.
    failover: FailoverFigures | None = None
    during_failover: Measured | None = None
    #: With ``--chaos``: what the chaos checks found (empty: every check held).
    chaos: ChaosOutcome | None = None


@dataclass(frozen=True)
class Options:
    """What a run does besides the figures of every N."""

    failover: bool = False
    chaos: bool = False


class Metrics:
    """The apiserver's ``/metrics``, read with the admin's client certificate."""

    def __init__(self, plane: ControlPlane) -> None:
        pair = plane.pki.client("admin", user="kubernetes-admin", groups=("system:masters",))
        context = ssl.create_default_context(cafile=str(plane.pki.ca.cert))
        context.load_cert_chain(str(pair.cert), str(pair.key))
        self._context = context
        self._url = f"{plane.server}/metrics"

    async def text(self) -> str:
        async with (
            aiohttp.ClientSession() as session,
            session.get(self._url, ssl=self._context) as answer,
        ):
            answer.raise_for_status()
            return await answer.text()


def fleet_of(n: int) -> tuple[dict[str, dict[str, str]], dict[str, UltraServerInfo]]:
    """name -> labels, and name -> its UltraServer, of N trn2u nodes (N/4 UltraServers)."""
    # A fleet file's group holds at most 1,000 UltraServers; larger fleets take several
    # groups (their UltraServers are numbered on across groups, so names stay unique).
    groups = [min(1000, n // 4 - start) for start in range(0, n // 4, 1000)]
    fleet = parse_fleet(
        "ultraServers:\n"
        + "".join(f"  - instanceType: {INSTANCE_TYPE}\n    count: {c}\n" for c in groups),
        source="bench",
    )
    labels: dict[str, dict[str, str]] = {}
    where: dict[str, UltraServerInfo] = {}
    for spec in fleet.nodes:
        us = spec.ultraserver
        if us is None:
            continue
        labels[spec.name] = node_labels(fleet, spec)
        where[spec.name] = UltraServerInfo(
            server_id_2=us.server_id_2,
            server_id_4=us.server_id_4,
            node_id_2=us.node_id_2,
            node_id_4=us.node_id_4,
            supported_modes=(1, 2, 3, 4),
        )
    return labels, where


def _hardware() -> NodeHardware:
    from neuron_dra_common.hardware.node import read_node
    from neuron_dra_common.hardware.simulate import write_node

    with tempfile.TemporaryDirectory() as tmp:
        sim = write_node(Path(tmp), instance_type=INSTANCE_TYPE, node_name="bench")
        return read_node(sim.root, neuron_ls_command=sim.neuron_ls_command)


def _slices(name: str, hardware: NodeHardware, labels: dict[str, str], uid: str) -> list[Obj]:
    """The ResourceSlices the publisher writes for one node (the bare loop's bodies)."""
    from neuron_dra_slice_publisher.pool import NodeRef, render_slice
    from neuron_dra_slice_publisher.slices import NodeDeviceMode, build_pool

    content = build_pool(
        node=name,
        hardware=hardware,
        labels=labels,
        mode=NodeDeviceMode.COUNTERS,
        dra_driver_version="0.1.0",
    )
    owner = NodeRef(name=name, uid=uid)
    return [
        render_slice(s, owner=owner, index=i, generation=1, count=len(content.slices))
        for i, s in enumerate(content.slices)
    ]


def _service_components(
    plane: ControlPlane, cluster: NatsCluster, root: Path, publishers: int = 1
) -> list[comp.Component]:
    """The cluster services with the environment ``dev up`` gives them (stack.services,
    stack.ultraserver, stack.health, stack.alerting), on the NATS cluster."""
    from neuron_dra_cli.stack.alerting import audit_file
    from neuron_dra_cli.stack.health import health_components
    from neuron_dra_cli.stack.ultraserver import ultraserver_components

    urls = ",".join(cluster.urls)
    shared = {
        "NEURON_DRA_INSECURE_BUS": "1",
        "NEURON_DRA_STREAM_REPLICAS": "3",
        "NEURON_DRA_LOG_LEVEL": "warning",
    }
    items = [
        *(
            comp.python_service(
                name=_publisher(i),
                kind="slice-publisher",
                module="neuron_dra_slice_publisher",
                env={
                    "NEURON_DRA_KUBECONFIG": str(plane.admin),
                    "NEURON_DRA_NATS_SERVERS": urls,
                    "NEURON_DRA_IDENTITY": f"local-{i}" if i else "local",
                    "NEURON_DRA_LEASE_SECONDS": "6",
                    "NEURON_DRA_PARTITIONS": str(publishers),
                },
            )
            for i in range(publishers)
        ),
        *health_components(nats_url=urls, kubeconfig=plane.admin),
        *ultraserver_components(nats_url=urls, kubeconfig=plane.admin),
        comp.python_service(
            name="audit",
            kind="audit",
            module="neuron_dra_audit",
            env={
                "NEURON_DRA_NATS_SERVERS": urls,
                "NEURON_DRA_AUDIT_FILE": str(audit_file(root)),
                "NEURON_DRA_STDOUT": "false",
            },
        ),
    ]
    return [
        comp.Component(
            name=c.name,
            kind=c.kind,
            argv=c.argv,
            ports=c.ports,
            ready=c.ready,
            env={**c.env, **shared},
            module=c.module,
        )
        for c in items
    ]


def _publisher(i: int) -> str:
    """The process name of slice publisher ``i`` (the first keeps the single one's name)."""
    return f"slice-publisher-{i + 1}" if i else "slice-publisher"


class Run:
    """One N: the servers are up; this drives the fleet and takes the figures."""

    def __init__(
        self,
        *,
        plane: ControlPlane,
        cluster: NatsCluster,
        root: Path,
        sizes: Sizes,
        options: Options = Options(),
    ):
        self.plane = plane
        self.cluster = cluster
        self.root = root
        self.sizes = sizes
        self.options = options
        self.m = Measured(sizes=sizes)
        self.metrics = Metrics(plane)
        self.progress = Progress(f"scale {sizes.nodes:,}")
        self.pids: dict[str, int] = {}
        self.ports: dict[str, int] = {}
        self.kube: KubeClient
        self.bus: Bus

    def servers(self) -> dict[str, int]:
        return self.plane.pids()

    async def go(self) -> Measured:
        self.kube = await connect(kubeconfig=self.plane.admin)
        self.bus = await Bus.connect(self.cluster.urls, name="bench-scale")
        try:
            await self._go()
        finally:
            await self.bus.close()
            await self.kube.close()
        return self.m

    async def _go(self) -> None:
        n = self.sizes.nodes
        labels, where = fleet_of(n)
        hardware = _hardware()
        await self.kube.create(NAMESPACES, {"metadata": {"name": NAMESPACE}})
        # As every node's discovery does when it starts, before its first publish.
        await self.bus.reconcile(replicas=3)
        fleet = FleetSim(
            kube=self.kube,
            publisher=self.bus.publisher(source="/bench/scale"),
            nodes=labels,
        )
        t0 = time.perf_counter()
        async with self.progress.phase("nodes registered", n, lambda: fleet.registered):
            uids = await fleet.register()
        fleet.start(agents=False)
        agents = await Agents.start(self.cluster.urls, list(labels))
        try:
            await self._measure(fleet, agents, labels, hardware, where, uids, t0)
        finally:
            await agents.stop()
            await fleet.stop()

    async def _measure(
        self,
        fleet: FleetSim,
        agents: Agents,
        labels: dict[str, dict[str, str]],
        hardware: NodeHardware,
        where: dict[str, UltraServerInfo],
        uids: dict[str, str],
        t0: float,
    ) -> None:
        n = self.sizes.nodes
        self.m.notes.append(f"{n} Nodes and Leases made in {time.perf_counter() - t0:.1f} s")
        hw = {name: msgspec.structs.replace(hardware, ultraserver=where[name]) for name in labels}
        bodies = [_slices(name, hw[name], labels[name], uids[name]) for name in labels]
        if not self.sizes.only_workloads:
            async with self.progress.phase("bare write loop (every node's slices, then deleted)"):
                await self._bare(bodies)

        loop = asyncio.get_running_loop()
        publishers = self.sizes.publisher_replicas
        async with self.progress.phase(
            "services started", len(SERVICES) + publishers - 1, lambda: len(self.pids)
        ):
            for c in _service_components(self.plane, self.cluster, self.root, publishers):
                running = await loop.run_in_executor(None, self.plane.start, c)
                self.pids[c.name] = running.pid
                self.ports[c.name] = c.ports.get("http", 0)
        inventories = [
            NodeInventory(
                node=name,
                boot_id="bench",
                generation=1,
                hardware=hw[name],
                dra_driver_version="0.1.0",
            )
            for name in labels
        ]
        total = sum(len(b) for b in bodies)
        await self._cold(fleet, inventories, total)
        async with self.progress.phase("NeuronUltraServers Available", n // 4) as tally:
            await self._wait_ultraservers(n // 4, tally)

        health = BusEvents(self.bus, stream=HEALTH.name, subject=f"{HEALTH.subjects[0]}")
        taints = BusEvents(self.bus, stream=TAINTS.name, subject=f"{TAINTS.subjects[0]}")
        followers = [
            asyncio.create_task(health.follower.run(), name="health"),
            asyncio.create_task(taints.follower.run(), name="taints"),
        ]
        try:
            await asyncio.sleep(1.0)  # the followers are at the streams' ends
            if not self.sizes.only_workloads:
                async with self.progress.phase(f"steady state ({self.sizes.steady_seconds:g} s)"):
                    await self._steady(agents)
                async with self.progress.phase("device faults tainted", self.sizes.faults) as tally:
                    await self._faults(taints, list(labels), tally)
            async with self.progress.phase(
                "workloads Allocated, then deleted", self.sizes.workloads
            ) as tally:
                await self._workloads(tally)
            silenced: list[str] = []
            if not self.sizes.only_workloads:
                async with self.progress.phase("silent nodes lost", self.sizes.lost) as tally:
                    silenced = await self._lost(agents, health, list(labels), tally)
            if self.options.failover:
                await self._failover(agents, health, taints, list(labels), inventories[0], silenced)
            if self.options.chaos:
                await self._chaos(list(labels))
            failed = " ".join(x for x in (fleet.failed(), (await agents.stats())[1]) if x)
            if failed:
                self.m.notes.append(f"the simulated fleet: {failed}")
        finally:
            for task in followers:
                task.cancel()
            await asyncio.gather(*followers, return_exceptions=True)
        self.m.rss_mib = {
            name: peak_rss_mib(pid) for name, pid in {**self.pids, **self.servers()}.items()
        } | {name: peak_rss_mib(pid) for name, pid in self.cluster.pids.items()}
        self.m.store_mib = {k: v / MIB for k, v in self.cluster.store_bytes().items()}
        log = self.root / "failure-detector.log"
        declared = log.read_text().count('"message":"node lost"') if log.exists() else 0
        self.m.notes.append(
            f"the detector declared {declared} nodes lost in the whole run, of which "
            f"{self.sizes.lost} were silenced by the bench (the others: heartbeats the "
            "simulated fleet sent late)"
        )

    async def _bare(self, bodies: list[list[Obj]]) -> None:
        before = apiserver_writes(await self.metrics.text(), only=("resourceslices",))
        out = await baseline_env.run_script(
            "slices_bare.py",
            {
                "kubeconfig": str(self.plane.admin),
                "path": f"/apis/{RESOURCE_SLICES.api_version}/{RESOURCE_SLICES.plural}",
                "workers": WORKERS,
                "change_gap": 0.0,
                "pools": bodies,
                "changes": [],
                "servers": self.servers(),
            },
        )
        self.m.bare_s = float(out["seconds"])
        after = apiserver_writes(await self.metrics.text(), only=("resourceslices",))
        self.m.bare_writes = after - before
        written, _ = await self.kube.list(RESOURCE_SLICES)
        slots = asyncio.Semaphore(WORKERS)

        async def delete(name: str) -> None:
            async with slots:
                await self.kube.delete(RESOURCE_SLICES, name)

        await asyncio.gather(*(delete(str(o["metadata"]["name"])) for o in written))
        for _ in range(1200):
            if not (await self.kube.list(RESOURCE_SLICES))[0]:
                return
            await asyncio.sleep(0.25)
        raise RuntimeError("the bare loop's slices were not deleted within 5 minutes")

    async def _cold(self, fleet: FleetSim, inventories: list[NodeInventory], total: int) -> None:
        """Publish every inventory; wait until the publisher wrote ``total`` slices."""
        async with self.progress.phase("slices written by the publisher", total) as tally:
            await self._cold_slices(fleet, inventories, total, tally)

    async def _cold_slices(
        self, fleet: FleetSim, inventories: list[NodeInventory], total: int, tally: Tally
    ) -> None:
        _, version = await self.kube.list(RESOURCE_SLICES)
        before = apiserver_writes(await self.metrics.text(), only=("resourceslices",))
        publishers = {
            name: self.pids[name] for name in map(_publisher, range(self.sizes.publisher_replicas))
        }
        cpu0 = cpu_seconds(publishers)
        seen: set[str] = set()
        t0 = time.perf_counter()
        await fleet.publish_inventories(inventories)
        deadline = t0 + 600.0
        done_at = 0.0
        while not done_at:
            async for event in self.kube.watch(RESOURCE_SLICES, resource_version=version):
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    raise RuntimeError(f"slice watch failed: {obj}")
                version = str(obj["metadata"]["resourceVersion"])
                if event.get("type") == "ADDED":
                    seen.add(str(obj["metadata"]["name"]))
                    tally.done = len(seen)
                if len(seen) >= total:
                    done_at = time.perf_counter()
                    break
            if time.perf_counter() > deadline:
                raise RuntimeError(f"{len(seen)} of {total} slices written within 600 s")
        self.m.slices_s = done_at - t0
        cpu1 = cpu_seconds(publishers)
        self.m.publisher_cpu_s = sum(cpu1.values()) - sum(cpu0.values())
        after = apiserver_writes(await self.metrics.text(), only=("resourceslices",))
        self.m.slice_writes = after - before
        each = ", ".join(
            f"{name} {cpu1[name] - cpu0[name]:.1f} s CPU, {peak_rss_mib(pid):.0f} MiB peak"
            for name, pid in publishers.items()
        )
        line = (
            f"slices from cold with {len(publishers)} publisher(s): {self.m.slices_s:.1f} s "
            f"({self.m.slices_s / self.m.bare_s:.2f}x the bare loop's {self.m.bare_s:.1f} s); "
            f"{each}"
        )
        self.m.notes.append(line)
        print(line, file=sys.stderr, flush=True)

    async def _wait_ultraservers(self, count: int, tally: Tally) -> None:
        deadline = time.monotonic() + 120.0 + count * 0.2
        while True:
            nus, _ = await self.kube.list(NUS, namespace=US_NAMESPACE)
            available = [
                o
                for o in nus
                if (o.get("status") or {}).get("state") == "Available"
                and (o.get("status") or {}).get("healthyNodeCount") == 4
            ]
            tally.done = len(available)
            if len(available) >= count:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(available)} of {count} NeuronUltraServers Available")
            await asyncio.sleep(1.0)

    async def _steady(self, agents: Agents) -> None:
        pids = {
            **self.pids,
            **self.servers(),
            **self.cluster.pids,
            "bench (the simulated agents)": agents.pid,
        }
        beats0 = (await agents.stats())[0]
        cpu0, t0, own0 = cpu_seconds(pids), time.perf_counter(), time.process_time()
        await asyncio.sleep(self.sizes.steady_seconds)
        cpu1, t1, own1 = cpu_seconds(pids), time.perf_counter(), time.process_time()
        self.m.steady_cores = {k: (cpu1[k] - cpu0[k]) / (t1 - t0) for k in pids}
        self.m.steady_cores["bench (the simulated kubelets)"] = (own1 - own0) / (t1 - t0)
        self.m.heartbeats_per_s = ((await agents.stats())[0] - beats0) / (t1 - t0)

    async def _faults(self, taints: BusEvents, names: list[str], tally: Tally) -> None:
        publisher = self.bus.publisher(source="/bench/scale/probe")
        device = "neurondevice3"
        for k in range(self.sizes.faults):
            node = names[(k * 7919) % len(names)]

            def tainted(e: AnyEvent, node: str = node) -> bool:
                return (
                    isinstance(e, DeviceTaintChanged)
                    and e.node == node
                    and e.device == device
                    and bool(e.taints)
                )

            def cleared(e: AnyEvent, node: str = node) -> bool:
                return (
                    isinstance(e, DeviceTaintChanged)
                    and e.node == node
                    and e.device == device
                    and not e.taints
                )

            seen = taints.expect(f"{node} {device} tainted", tainted)
            t0 = time.perf_counter()
            await publisher.publish(
                DeviceHealthChanged(
                    node=node,
                    device=device,
                    health="Unhealthy",
                    previous="Healthy",
                    error_type="SRAM_UNCORRECTABLE_ERROR",
                    severity="uncorrectable",
                    evidence="bench",
                    action="reload-driver-or-reboot",
                    observed_at=datetime.now(UTC),
                )
            )
            self.m.taint_s.append(await asyncio.wait_for(seen, 60.0) - t0)
            gone = taints.expect(f"{node} {device} repaired", cleared)
            await publisher.publish(
                DeviceHealthChanged(
                    node=node,
                    device=device,
                    health="Healthy",
                    previous="Unhealthy",
                    observed_at=datetime.now(UTC),
                )
            )
            await asyncio.wait_for(gone, 60.0)
            tally.done += 1

    async def _workloads(self, tally: Tally) -> None:
        count = self.sizes.workloads
        nusw = msgspec.structs.replace(NUSW, version=VERSION)
        names = [f"scale-{i:03d}" for i in range(count)]
        _, version = await self.kube.list(nusw, namespace=NAMESPACE)
        skip = (("leases", ""), ("nodes", "status"))
        before = apiserver_writes_by(await self.metrics.text(), skip=skip)
        allocated: dict[str, float] = {}
        started: dict[str, float] = {}

        async def create(name: str) -> None:
            started[name] = time.perf_counter()
            await self.kube.create(
                nusw,
                workload_body(name, size=4, count=1, group=GROUP),
                namespace=NAMESPACE,
            )

        async def watch() -> None:
            nonlocal version
            while len(allocated) < count:
                async for event in self.kube.watch(
                    nusw, namespace=NAMESPACE, resource_version=version
                ):
                    obj = event.get("object") or {}
                    version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                    name = str((obj.get("metadata") or {}).get("name"))
                    state = (obj.get("status") or {}).get("state")
                    if state == "Allocated" and name not in allocated:
                        allocated[name] = time.perf_counter()
                        tally.done += 1
                    if len(allocated) >= count:
                        return

        watching = asyncio.create_task(watch())
        await asyncio.sleep(0.2)
        await asyncio.gather(*(create(name) for name in names))
        try:
            await asyncio.wait_for(watching, 300.0)
        except TimeoutError:
            raise RuntimeError(
                f"{len(allocated)} of {count} workloads Allocated within 300 s"
            ) from None
        after = apiserver_writes_by(await self.metrics.text(), skip=skip)
        made = {k: v - before.get(k, 0.0) for k, v in after.items() if v > before.get(k, 0.0)}
        # The bench's own writes in that time: the creates, and the fleet's status posts.
        self.m.writes_per_workload = (sum(made.values()) - count) / count
        self.m.notes.append(
            "writes per workload by request: "
            + ", ".join(
                f"{k} {v / count:.1f}" for k, v in sorted(made.items(), key=lambda i: -i[1])
            )
        )
        self.m.allocated_s = [allocated[n] - started[n] for n in names]
        self.m.notes.append(
            f"{count} workloads: all Allocated {max(allocated.values()) - min(started.values()):.1f}"
            " s after the first create"
        )
        for name in names:
            await self.kube.delete(nusw, name, namespace=NAMESPACE)
        for _ in range(600):
            if not (await self.kube.list(nusw, namespace=NAMESPACE))[0]:
                return
            await asyncio.sleep(0.5)
        raise RuntimeError("the workloads were not deleted within 5 minutes")

    async def _lost(
        self,
        agents: Agents,
        health: BusEvents,
        names: list[str],
        tally: Tally,
        avoid: Sequence[str] = (),
    ) -> list[str]:
        """Silence ``sizes.lost`` nodes (none of ``avoid``: a node just resumed may not be
        recovered yet, and a lost node is not declared lost again); return them."""
        spread = (names[(k * 104729 + 13) % len(names)] for k in range(len(names)))
        picked = [n for n in dict.fromkeys(spread) if n not in avoid][: self.sizes.lost]
        waits = []
        for node in picked:

            def lost(e: AnyEvent, node: str = node) -> bool:
                return isinstance(e, NodeLost) and e.node == node

            future = health.expect(f"{node} lost", lost)
            last = await agents.silence(node)
            waits.append((node, last, future))
            await asyncio.sleep(0.3)
        try:
            for node, last, future in waits:
                try:
                    self.m.lost_s.append(await asyncio.wait_for(future, 60.0) - last)
                except TimeoutError:
                    raise RuntimeError(f"{node} silenced, not declared lost within 60 s") from None
                tally.done += 1
        finally:
            for node in picked:
                await agents.resume(node)
        return picked

    def _declared_lost(self) -> int:
        """Nodes the detector declared lost so far (its log)."""
        log = self.root / "failure-detector.log"
        return log.read_text().count('"message":"node lost"') if log.exists() else 0

    async def _failover(
        self,
        agents: Agents,
        health: BusEvents,
        taints: BusEvents,
        names: list[str],
        probe: NodeInventory,
        silenced: list[str],
    ) -> None:
        """The server leading every stream killed while the workloads are being allocated;
        the faults and the silent nodes through the failover; then the audit reconciled."""
        failover = Failover(
            bus=self.bus,
            cluster=self.cluster,
            ports=self.ports,
            audit_file=audit_file(self.root),
            probe_node=probe,
        )
        async with self.progress.phase("failover: every stream's leader moved to one server"):
            victim = await failover.arm()
        steady, self.m = self.m, Measured(sizes=self.sizes)
        declared = self._declared_lost()
        try:
            async with self.progress.phase(
                f"failover: {victim} killed while {self.sizes.workloads} workloads are allocated"
                ", with faults and silent nodes",
                self.sizes.workloads + self.sizes.faults + self.sizes.lost,
            ) as tally:
                workloads = asyncio.create_task(self._workloads(tally), name="failover workloads")
                await asyncio.sleep(1.0)  # the creates are in; the allocations under way
                await failover.kill()
                # One measurement failing through the failover is a finding, not the end of
                # the run: it is noted, and the failover's own figures are still taken.
                outcomes = await asyncio.gather(
                    workloads,
                    self._faults(taints, names, tally),
                    self._lost(agents, health, names, tally, avoid=silenced),
                    return_exceptions=True,
                )
            for what, outcome in zip(
                ("workloads", "faults", "silent nodes"), outcomes, strict=True
            ):
                if isinstance(outcome, BaseException):
                    self.m.notes.append(f"{what} FAILED: {outcome!r}")
            async with self.progress.phase("failover: the audit catching up"):
                figures = await failover.finish(await agents.claim_ids())
        finally:
            during, self.m = self.m, steady
        self.m.failover, self.m.during_failover = figures, during
        false = self._declared_lost() - declared - self.sizes.lost
        self.m.notes += [f"through the failover: {note}" for note in during.notes]
        self.m.notes.append(
            f"through the failover the detector declared {max(0, false)} nodes lost besides the "
            f"{self.sizes.lost} silenced"
        )

    async def _chaos(self, names: list[str]) -> None:
        chaos = ScaleChaos(
            kube=self.kube,
            bus=self.bus,
            nats_url=self.cluster.urls[0],
            nodes=names,
            restart=self._restart_service,
            progress=self.progress,
        )
        self.m.chaos = await chaos.run(steps=self.sizes.chaos_steps)

    async def _restart_service(self, name: str) -> None:
        """SIGKILL the service ``name`` and start it again, as its Deployment would."""
        loop = asyncio.get_running_loop()
        for c in _service_components(self.plane, self.cluster, self.root):
            if c.name == name:
                os.kill(self.pids[name], signal.SIGKILL)
                running = await loop.run_in_executor(None, self.plane.start, c)
                self.pids[name] = running.pid
                return
        raise KeyError(name)


# --- the report ------------------------------------------------------------------------------


def figures(m: Measured) -> list[Figure]:
    s = m.sizes
    out = [
        Figure(
            name="slices from cold",
            unit="s",
            value=m.slices_s,
            baseline=m.bare_s,
            baseline_name="bare write loop",
            higher_is_better=False,
        ),
        Figure(
            name="slice writes",
            unit="writes",
            value=m.slice_writes,
            baseline=m.bare_writes,
            baseline_name="bare write loop",
            higher_is_better=False,
        ),
        Figure(
            name="publisher CPU, cold",
            unit="s",
            value=m.publisher_cpu_s,
            baseline=m.slices_s,
            baseline_name="wall time",
            higher_is_better=False,
        ),
        Figure(
            name=f"device fault -> taint p99 ({s.faults})",
            unit="ms",
            value=_percentile(m.taint_s, 99) * 1000.0,
            baseline=_percentile(m.taint_s, 50) * 1000.0,
            baseline_name="its p50",
            higher_is_better=False,
        ),
        Figure(
            name=f"silent node -> lost p99 ({s.lost})",
            unit="s",
            value=_percentile(m.lost_s, 99),
            baseline=GOAL_LOST_P99_S,
            baseline_name="goal",
            higher_is_better=False,
        ),
        Figure(
            name="detector CPU, steady",
            unit="cores",
            value=m.steady_cores.get("failure-detector", 0.0),
            baseline=GOAL_DETECTOR_CORES,
            baseline_name="goal",
            higher_is_better=False,
        ),
        Figure(
            name=f"{s.workloads} workloads -> Allocated p50",
            unit="s",
            value=percentile(m.allocated_s, 50),
            baseline=GOAL_WORKLOADS_S,
            baseline_name="goal for all",
            higher_is_better=False,
        ),
        Figure(
            name=f"{s.workloads} workloads -> Allocated p99",
            unit="s",
            value=percentile(m.allocated_s, 99),
            baseline=GOAL_WORKLOADS_S,
            baseline_name="goal for all",
            higher_is_better=False,
        ),
        Figure(
            name="apiserver writes per workload",
            unit="writes",
            value=m.writes_per_workload,
            baseline=m.writes_per_workload,
            baseline_name="(no baseline)",
            higher_is_better=False,
        ),
    ]
    out += [
        Figure(
            name=f"{name} peak RSS",
            unit="MiB",
            value=m.rss_mib.get(name, 0.0),
            baseline=GOAL_RSS_MIB,
            baseline_name="goal",
            higher_is_better=False,
        )
        for name in SERVICES
    ]
    if s.only_workloads:
        return [f for f in out if "workload" in f.name or "RSS" in f.name]
    return out


def _percentile(values: list[float], p: float) -> float:
    """As ``percentile``; 0 for a part that did not run (``--only``)."""
    return percentile(values, p) if values else 0.0


def failover_figures(m: Measured) -> list[Figure]:
    """The figures taken through the failover, each against its steady twin of the run."""
    d = m.during_failover
    if d is None:
        return []
    pairs = [
        ("device fault -> taint p99", "ms", [x * 1000.0 for x in d.taint_s], m.taint_s, 99),
        ("silent node -> lost p99", "s", d.lost_s, m.lost_s, 99),
        (f"{d.sizes.workloads} workloads -> Allocated p50", "s", d.allocated_s, m.allocated_s, 50),
        (f"{d.sizes.workloads} workloads -> Allocated p99", "s", d.allocated_s, m.allocated_s, 99),
    ]
    out = [
        Figure(
            name=f"failover: {name}",
            unit=unit,
            value=percentile(during, q) if during else float("nan"),
            baseline=(percentile(steady, q) * (1000.0 if unit == "ms" else 1.0))
            if steady
            else float("nan"),
            baseline_name="steady",
            higher_is_better=False,
        )
        for name, unit, during, steady, q in pairs
    ]
    out.append(
        Figure(
            name="failover: apiserver writes per workload",
            unit="writes",
            value=d.writes_per_workload,
            baseline=m.writes_per_workload,
            baseline_name="steady",
            higher_is_better=False,
        )
    )
    return out


def failover_notes(m: Measured) -> list[str]:
    f = m.failover
    if f is None:
        return []
    resume = ", ".join(
        f"{k} {'never' if v is None else f'{v:.1f} s'}" for k, v in sorted(f.resume_s.items())
    )
    return [
        f"failover: killed {f.killed} (SIGKILL), which led {', '.join(f.led)}",
        f"  every consumer resumed <= 5 s: {verdict(f.resumed_within_goal())} ({resume})",
        "  new leaders after (s): "
        + ", ".join(f"{k} {v:.1f}" for k, v in sorted(f.elected_s.items())),
        "  audit stream's sources read again after (s): "
        + (", ".join(f"{k} {v:.1f}" for k, v in sorted(f.audit_sources_s.items())) or "-"),
        f"  no event lost (the audit reconciles): {verdict(f.nothing_lost())}: "
        f"{f.published:,} events acknowledged, {len(f.missing)} missing from the audit, "
        f"{len(f.twice)} in it twice, {f.probes_failed} probe publishes failed; the audit held "
        "every one "
        + ("-" if f.audit_caught_up_s is None else f"{f.audit_caught_up_s:.1f} s after the kill"),
        f"  inventories of one node published through the failover: {f.inventories}, of which "
        f"{f.inventories_superseded} never reached the audit (replaced in the inventory stream, "
        "which keeps one per node, before the audit stream's source read it again)",
    ]


def goals(m: Measured) -> dict[str, bool]:
    """The goals (set for 10,000 nodes), judged on this run's figures."""
    ratio = m.slices_s / m.bare_s if m.bare_s else float("inf")
    workloads = bool(m.allocated_s) and max(m.allocated_s) <= GOAL_WORKLOADS_S
    if m.sizes.only_workloads:
        return {"all workloads Allocated <= 30 s": workloads}
    return {
        "lost node p99 <= 5 s": bool(m.lost_s) and percentile(m.lost_s, 99) <= GOAL_LOST_P99_S,
        "detector under half a core": m.steady_cores.get("failure-detector", 0.0)
        < GOAL_DETECTOR_CORES,
        "slices cold <= 1.2 x bare": ratio <= GOAL_SLICES_RATIO,
        "all workloads Allocated <= 30 s": workloads,
        "no service over 1 GiB": all(m.rss_mib.get(s, 0.0) <= GOAL_RSS_MIB for s in SERVICES),
    }


def one_report(m: Measured) -> tuple[Report, str]:
    """The table and the JSON line of one N."""
    n = m.sizes.nodes
    report = Report(name=f"scale ({n:,} trn2u nodes, {n // 4:,} UltraServers)")
    report.figures = figures(m)
    judged = "" if n >= GOAL_NODES else f" (the goals are set for {GOAL_NODES:,}; judged at {n:,})"
    report.notes.append("goals" + judged + ":")
    report.notes += [f"  {name}: {verdict(ok)}" for name, ok in goals(m).items()]
    report.notes.append(
        "steady CPU (cores): "
        + ", ".join(f"{k} {v:.2f}" for k, v in sorted(m.steady_cores.items()) if v >= 0.005)
    )
    report.notes.append(
        "peak RSS (MiB): " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(m.rss_mib.items()))
    )
    report.notes.append(
        f"heartbeats stored: {m.heartbeats_per_s:,.0f}/s (wanted {n:,}/s); JetStream store: "
        + ", ".join(f"{k} {v:.1f} MiB" for k, v in sorted(m.store_mib.items()))
    )
    report.figures += failover_figures(m)
    report.notes += failover_notes(m)
    if m.chaos is not None:
        report.notes += m.chaos.lines()
    report.notes += m.notes
    line = json.loads(report.json_line())
    line.update(
        {
            "nodes": n,
            "rss_mib": {k: round(v, 1) for k, v in m.rss_mib.items()},
            "steady_cores": {k: round(v, 3) for k, v in m.steady_cores.items()},
            "heartbeats_per_s": round(m.heartbeats_per_s, 1),
            "store_mib": {k: round(v, 1) for k, v in m.store_mib.items()},
            "goals": {k: verdict(v) for k, v in goals(m).items()},
        }
    )
    if m.failover is not None:
        line["failover"] = m.failover.as_json()
    if m.chaos is not None:
        line["chaos"] = m.chaos.as_json()
    return report, json.dumps(line, separators=(",", ":"))


class ScaleReport(msgspec.Struct, kw_only=True):
    """Every N's table, then the services' memory against N; one JSON line per N."""

    runs: list[Measured] = msgspec.field(default_factory=list)

    def table(self) -> str:
        parts = [one_report(m)[0].table() for m in self.runs]
        if len(self.runs) >= 2:
            rows = []
            for name in (*SERVICES, "nats-0", "kube-apiserver", "etcd"):
                per_k, exponent = slope(
                    {m.sizes.nodes: m.rss_mib.get(name, 0.0) for m in self.runs}
                )
                flag = "  faster than linear" if exponent > 1.1 else ""
                rows.append(
                    f"  {name}: {per_k:+.1f} MiB per 1,000 nodes, exponent {exponent:.2f}{flag}"
                )
            parts.append("== peak RSS against N\n" + "\n".join(rows))
        return "\n\n".join(parts)

    def json_line(self) -> str:
        return "\n".join(one_report(m)[1] for m in self.runs)


def measure(sizes: Sizes, options: Options = Options()) -> Measured:
    """Everything of one N, from fresh servers to their stop."""
    with tempfile.TemporaryDirectory(prefix=f"bench-scale-{sizes.nodes}-") as tmp:
        root = Path(tmp)
        with control_plane(root) as plane, nats_cluster(root / "nats") as cluster:
            plane.start(
                comp.controller_manager(
                    binary=plane.binaries.kube_controller_manager,
                    pki=plane.pki,
                    kubeconfig=plane.kubeconfig(
                        "kube-controller-manager", user="system:kube-controller-manager"
                    ),
                    port=process.free_port(),
                )
            )
            plane.start(
                comp.scheduler(
                    binary=plane.binaries.kube_scheduler,
                    kubeconfig=plane.kubeconfig("kube-scheduler", user="system:kube-scheduler"),
                    port=process.free_port(),
                )
            )
            services.apply_cluster_objects(plane.admin)
            run = Run(plane=plane, cluster=cluster, root=root, sizes=sizes, options=options)
            return asyncio.run(run.go())


def run(
    *,
    quick: bool,
    nodes: Sequence[int] = (),
    only: str = "",
    failover: bool = False,
    chaos: bool = False,
    publisher_replicas: int = 1,
) -> ScaleReport:
    counts = list(nodes) or ([QUICK_NODES] if quick else [1000])
    options = Options(failover=failover, chaos=chaos)
    report = ScaleReport()
    for n in counts:
        sizes = Sizes.of(n, quick=quick, only=only, publisher_replicas=publisher_replicas)
        t0 = time.monotonic()
        m = measure(sizes, options)
        m.notes.append(
            f"run of {n:,} nodes took {time.monotonic() - t0:.0f} s; load average at the end "
            f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
        )
        report.runs.append(m)
    return report
