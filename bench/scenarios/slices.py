"""Slice publishing for many trn2 nodes against a bare kubernetes-asyncio write loop.

One local stack (its real etcd and kube-apiserver; a single simulated node) holds N Node
objects. In the same run:

* **bare loop**: kubernetes-asyncio's ``ApiClient`` creates the very slice objects the
  publisher would write, with the same concurrency, nothing else (``bench/bare/slices_bare.py``,
  in a child process of the same environment: see ``bench/baseline_env.py``);
* **publisher**: N NodeInventory events are published on the bus; the publisher's real
  controller (durable consumer, Node and slice informers, work queue, KubeSliceStore) writes
  every pool. Timed from the first publish to the last pool written.

Then one device change: a new inventory for one node (driver version changed) until its pool
is rewritten, against a bare replace of the same slice (p50/p99 over many samples). Each
sample, of either writer, starts after the same short quiet gap (``CHANGE_GAP``), as one
change in a settled fleet does; the bare replace's clock covers the PUT only, the
publisher's the publish, the bus hop, the queue, the build and the PUT.

The two writers alternate over several rounds (each on fresh Nodes, every slice and Node
deleted between rounds, the first writer swapped each round); the figure is the median
round, and every round's pair is printed, so drift in machine load shows instead of
deciding the ratio.
"""

from __future__ import annotations

import asyncio
import cProfile
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
from neuron_dra_cli.stack import busauth

from bench import baseline_env
from bench.harness import Figure, Report, cpu_seconds, cpu_used, percentile, proc_stat

if TYPE_CHECKING:
    from neuron_dra_common.bus import BusCredentials

WORKERS = 16
# Before each timed device change both writers wait this long, so the change starts on a
# quiet stack, as a single change in a settled fleet does. Without it each sample would
# begin while the apiserver still fans the previous write out to its watchers (the
# scheduler, the controller-manager, the operator, the writer's own informer), and the bare
# loop, which reads the slice's resourceVersion before its clock starts, would get that
# quiet time for free.
CHANGE_GAP = 0.05
_BENCH_LABEL = "bench.neuron.aws.com/slices"
_REPO = Path(__file__).resolve().parents[2]
# The stack's one simulated node runs no driver (no discovery, no kubelet plugin): the bench
# Nodes are the only ones with pools, and nothing but the bench feeds the inventory stream.
_FLEET = (
    "nodes:\n  - instanceType: trn1.32xlarge\n    count: 1\n"
    '    labels:\n      neuron.aws.com/driver: "false"\n'
)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "neuron_dra_cli", *args],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=_REPO,
        env=os.environ.copy(),
    )


def _node(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "node.kubernetes.io/instance-type": "trn2.48xlarge",
                "topology.k8s.aws/network-node-layer-1": "nn-bench-1",
                _BENCH_LABEL: "true",
            },
        },
    }


def _stop_component(recorded: dict[str, Any], name: str) -> None:
    """Stop one process of the stack by the pid it recorded (if it is still that process).

    The stack always runs a slice publisher; left running, it would consume the bench's
    inventories from the same durable consumer and write the bench's pools beside the
    publisher under test.
    """
    for component in recorded["components"]:
        if component["name"] != name:
            continue
        pid = int(component["pid"])
        fields = proc_stat(pid)
        if fields is None or int(fields[19]) != int(component["start_ticks"]):
            return
        os.kill(pid, signal.SIGTERM)
        for _ in range(200):
            fields = proc_stat(pid)
            if fields is None or fields[0] in ("Z", "X"):
                return
            time.sleep(0.05)
        raise RuntimeError(f"stack component {name} (pid {pid}) did not stop on SIGTERM")


async def _bounded(n: int, work: Any) -> None:
    sem = asyncio.Semaphore(WORKERS)

    async def one(i: int) -> None:
        async with sem:
            await work(i)

    await asyncio.gather(*(one(i) for i in range(n)))


class _Phase(msgspec.Struct, kw_only=True):
    """One timed write of every pool: wall time, CPU used per server, slice writes."""

    label: str
    seconds: float
    cpu: dict[str, float]
    own: float
    writes: int


class _Bench:
    """The stack's apiserver and NATS, the simulated trn2 hardware, and both writers."""

    def __init__(
        self,
        kubeconfig: Path,
        nats_url: str,
        n: int,
        servers: dict[str, int],
        credentials: BusCredentials,
    ):
        self.kubeconfig = kubeconfig
        self.nats_url = nats_url
        self.credentials = credentials
        self.n = n
        self.servers = servers
        self.uids: dict[str, str] = {}

    async def open(self) -> None:
        from neuron_dra_common.hardware.node import read_node
        from neuron_dra_common.hardware.simulate import write_node
        from neuron_dra_common.kube import connect

        with tempfile.TemporaryDirectory() as tmp:
            sim = write_node(Path(tmp), instance_type="trn2.48xlarge", node_name="bench")
            self.hardware = read_node(sim.root, neuron_ls_command=sim.neuron_ls_command)
        self.kube = await connect(kubeconfig=self.kubeconfig)

    async def close(self) -> None:
        await self.kube.close()

    async def settle(self, *, idle_cores: float = 0.2, within: float = 60.0) -> float:
        """Wait until the stack's processes together use less than ``idle_cores`` (the
        controllers' reactions to the last round's deletes and to the new Nodes are over),
        so neither writer is timed against the other's aftermath; returns the wait."""
        t0 = time.perf_counter()
        window = 0.5
        while time.perf_counter() - t0 < within:
            before = sum(cpu_seconds(self.servers).values())
            await asyncio.sleep(window)
            if (sum(cpu_seconds(self.servers).values()) - before) / window < idle_cores:
                break
        return time.perf_counter() - t0

    async def make_nodes(self, names: list[str]) -> None:
        from neuron_dra_common.kube import NODES

        async def make(i: int) -> None:
            await self.kube.create(NODES, _node(names[i]))

        await _bounded(len(names), make)
        self.uids = {
            o["metadata"]["name"]: o["metadata"]["uid"] for o in (await self.kube.list(NODES))[0]
        }

    async def clear(self) -> None:
        """Delete every bench slice and Node, and wait until they are gone."""
        from neuron_dra_common.kube import NODES, RESOURCE_SLICES
        from neuron_dra_slice_publisher.store import SELECTOR

        await self.kube.delete_collection(RESOURCE_SLICES, label_selector=SELECTOR)
        await self.kube.delete_collection(NODES, label_selector=_BENCH_LABEL + "=true")
        for _ in range(600):  # deletecollection finishes asynchronously
            left = (await self.kube.list(RESOURCE_SLICES, label_selector=SELECTOR))[0]
            left += (await self.kube.list(NODES, label_selector=_BENCH_LABEL + "=true"))[0]
            if not left:
                return
            await asyncio.sleep(0.2)
        raise RuntimeError("bench slices and Nodes were not deleted within 2 minutes")

    def bodies(self, node: str, *, driver: str = "2.24.7.0") -> list[dict[str, Any]]:
        from neuron_dra_slice_publisher.pool import NodeRef, render_slice
        from neuron_dra_slice_publisher.slices import NodeDeviceMode, build_pool

        hw = msgspec.structs.replace(self.hardware, driver_version=driver)
        content = build_pool(
            node=node,
            hardware=hw,
            labels=_node(node)["metadata"]["labels"],
            mode=NodeDeviceMode.COUNTERS,
            dra_driver_version="0.1.0",
        )
        owner = NodeRef(name=node, uid=self.uids[node])
        count = len(content.slices)
        return [
            render_slice(s, owner=owner, index=i, generation=1, count=count)
            for i, s in enumerate(content.slices)
        ]

    async def bare_round(self, names: list[str], samples: int) -> tuple[_Phase, list[float]]:
        """The bare loop: POST every pool's slices; then ``samples`` single replaces.

        The bench renders the slices; ``bench/bare/slices_bare.py`` writes them, times the
        loop and each replace, and reads the servers' CPU time around the loop."""
        from neuron_dra_common.kube import RESOURCE_SLICES

        prepared = [self.bodies(name) for name in names]
        changes = [
            self.bodies(names[k % len(names)], driver=f"2.30.{k}.0")[0] for k in range(samples)
        ]
        out = await baseline_env.run_script(
            "slices_bare.py",
            {
                "kubeconfig": str(self.kubeconfig),
                "path": f"/apis/{RESOURCE_SLICES.api_version}/{RESOURCE_SLICES.plural}",
                "workers": WORKERS,
                "change_gap": CHANGE_GAP,
                "pools": prepared,
                "changes": changes,
                "servers": self.servers,
            },
        )
        phase = _Phase(
            label="bare loop",
            seconds=out["seconds"],
            cpu=cpu_used(out["cpu_before"], out["cpu_after"]),
            own=out["own"],
            writes=sum(len(p) for p in prepared),
        )
        return phase, list(out["changes"])

    async def publisher_round(
        self, names: list[str], samples: int, profiler: cProfile.Profile | None
    ) -> tuple[_Phase, list[float]]:
        """The publisher's real controller writes every pool from published inventories."""
        from neuron_dra_common.bus import Bus, consumer
        from neuron_dra_common.events import NodeInventory
        from neuron_dra_common.kube import NODES, RESOURCE_SLICES, Informer, run_workers
        from neuron_dra_slice_publisher.controller import Controller, NodeInfo
        from neuron_dra_slice_publisher.pool import slice_summary
        from neuron_dra_slice_publisher.slices import NodeDeviceMode
        from neuron_dra_slice_publisher.store import SELECTOR, KubeSliceStore

        bus = await Bus.connect([self.nats_url], name="bench-slices", credentials=self.credentials)
        await bus.reconcile(consumers=[consumer("slice-publisher-inventory")])
        nodes = Informer(self.kube, NODES, metadata_only=True)
        slices = Informer(
            self.kube,
            RESOURCE_SLICES,
            label_selector=SELECTOR,
            transform=slice_summary,
            metadata_only=True,
        )

        def lookup(name: str) -> NodeInfo | None:
            obj = nodes.cache.get(name)
            return NodeInfo.from_object(obj) if obj is not None else None

        controller = Controller(
            store=KubeSliceStore(self.kube),
            nodes=lookup,
            mode=NodeDeviceMode.COUNTERS,
            dra_driver_version="0.1.0",
        )
        nodes.add_listener(controller.node_changed)
        slices.add_listener(controller.slice_changed)
        written: dict[str, float] = {}
        done = asyncio.Event()
        wanted: set[str] = set(names)

        def on_written(node: str, generation: int) -> None:
            written[node] = time.perf_counter()
            if wanted <= written.keys():
                done.set()

        controller.on_written = on_written
        tasks = [
            asyncio.create_task(nodes.run(), name="bench-nodes"),
            asyncio.create_task(slices.run(), name="bench-slices"),
        ]
        await nodes.wait_synced()
        await slices.wait_synced()
        runner = bus.runner(consumer("slice-publisher-inventory"), controller.handle)
        tasks.append(asyncio.create_task(runner.run(), name="bench-runner"))
        tasks.append(
            asyncio.create_task(
                run_workers(controller.queue, controller.reconcile, workers=WORKERS),
                name="bench-workers",
            )
        )
        try:
            for _ in range(1000):
                if runner.ready:
                    break
                await asyncio.sleep(0.01)
            publisher = bus.publisher(source="/bench/discovery")

            def inventory(node: str, generation: int, driver: str) -> NodeInventory:
                return NodeInventory(
                    node=node,
                    boot_id="bench",
                    generation=generation,
                    hardware=msgspec.structs.replace(self.hardware, driver_version=driver),
                    dra_driver_version="0.1.0",
                )

            events = [inventory(name, 1, "2.24.7.0") for name in names]
            cpu0, own0 = cpu_seconds(self.servers), time.process_time()
            if profiler is not None:
                profiler.enable()
            t0 = time.perf_counter()
            await publisher.publish_many(events)
            await asyncio.wait_for(done.wait(), timeout=300)
            phase = _Phase(
                label="publisher",
                seconds=max(written.values()) - t0,
                cpu=cpu_used(cpu0, cpu_seconds(self.servers)),
                own=time.process_time() - own0,
                writes=sum(len(self.bodies(name)) for name in names),
            )
            if profiler is not None:
                profiler.disable()
            change: list[float] = []
            for k in range(samples):
                node = names[k % len(names)]
                written.pop(node, None)
                done.clear()
                wanted = {node}
                await asyncio.sleep(CHANGE_GAP)
                t = time.perf_counter()
                await publisher.publish(inventory(node, 2 + k, f"2.31.{k}.0"))
                await asyncio.wait_for(done.wait(), timeout=30)
                change.append(written[node] - t)
        finally:
            runner.stop()
            controller.queue.shutdown()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await bus.close()
        return phase, change


async def _measure(
    kubeconfig: Path,
    nats_url: str,
    n: int,
    samples: int,
    rounds: int,
    servers: dict[str, int],
    credentials: BusCredentials,
) -> Report:
    bench = _Bench(kubeconfig, nats_url, n, servers, credentials)
    await bench.open()
    profile_path = os.environ.get("NEURON_DRA_BENCH_PROFILE", "")
    profiler = cProfile.Profile() if profile_path else None
    phases: dict[str, list[_Phase]] = {"bare loop": [], "publisher": []}
    changes: dict[str, list[float]] = {"bare loop": [], "publisher": []}
    settled: list[float] = []
    try:
        for r in range(rounds):
            # Alternate which writer goes first, so a drift in machine load hits both alike.
            order = ("bare loop", "publisher") if r % 2 == 0 else ("publisher", "bare loop")
            for label in order:
                names = [f"bench-{r}{label[0]}-{i:05d}" for i in range(n)]
                await bench.make_nodes(names)
                settled.append(await bench.settle())
                if label == "bare loop":
                    phase, change = await bench.bare_round(names, samples // rounds)
                else:
                    phase, change = await bench.publisher_round(names, samples // rounds, profiler)
                phases[label].append(phase)
                changes[label] += change
                await bench.clear()
    finally:
        await bench.close()
    if profiler is not None:
        profiler.dump_stats(profile_path)

    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    bare_s = median([p.seconds for p in phases["bare loop"]])
    pub_s = median([p.seconds for p in phases["publisher"]])
    ms = 1000.0
    report = Report(name=f"slices ({n} trn2 nodes, {WORKERS} concurrent writers)")
    report.figures += [
        Figure(
            name=f"all pools complete (median of {rounds})",
            unit="s",
            value=pub_s,
            baseline=bare_s,
            baseline_name="bare kubernetes-asyncio loop",
            higher_is_better=False,
        ),
        Figure(
            name="device change -> slice p50",
            unit="ms",
            value=percentile(changes["publisher"], 50) * ms,
            baseline=percentile(changes["bare loop"], 50) * ms,
            baseline_name="bare replace",
            higher_is_better=False,
        ),
        Figure(
            name="device change -> slice p99",
            unit="ms",
            value=percentile(changes["publisher"], 99) * ms,
            baseline=percentile(changes["bare loop"], 99) * ms,
            baseline_name="bare replace",
            higher_is_better=False,
        ),
    ]
    report.notes.append(
        f"goals: all pools within 1.10 x the bare loop (got {pub_s / bare_s:.2f}),"
        f" {n} nodes in <= 10 s (got {pub_s:.2f} s)"
    )
    report.notes.append(
        "rounds (bare / publisher, s): "
        + "; ".join(
            f"{b.seconds:.2f} / {p.seconds:.2f}"
            for b, p in zip(phases["bare loop"], phases["publisher"], strict=True)
        )
    )
    for label, runs in phases.items():
        cpu = {k: sum(p.cpu.get(k, 0.0) for p in runs) / len(runs) for k in servers}
        writes = runs[0].writes
        servers_cpu = ", ".join(f"{k} {v:.1f}" for k, v in cpu.items() if v >= 0.05)
        per_write = 1000.0 * cpu.get("kube-apiserver", 0.0) / max(writes, 1)
        own = sum(p.own for p in runs) / len(runs)
        report.notes.append(
            f"{label}: {writes} slice writes per round; mean CPU s: {servers_cpu}, bench "
            f"process {own:.1f}; apiserver {per_write:.2f} ms CPU per write"
        )
    report.notes.append(
        f"before each timed phase the stack settled (under 0.2 cores busy) in"
        f" {min(settled):.1f}-{max(settled):.1f} s"
    )
    report.notes.append(
        f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    report.notes.append(json.dumps({"nodes": n, "samples": samples, "rounds": rounds}))
    return report


def run(*, quick: bool) -> Report:
    n, samples, rounds = (200, 20, 2) if quick else (1000, 125, 5)
    with tempfile.TemporaryDirectory(prefix="bench-slices-") as tmp:
        fleet = Path(tmp) / "fleet.yaml"
        fleet.write_text(_FLEET)
        state = Path(tmp) / "stack"
        up = _cli("dev", "up", "--detach", "--state-dir", str(state), "--fleet", str(fleet))
        if up.returncode != 0:
            raise RuntimeError(f"dev up failed:\n{up.stdout}\n{up.stderr}")
        try:
            recorded = json.loads((state / "state.json").read_text())
            _stop_component(recorded, "slice-publisher")
            # Every process of the stack: the controllers and the operator react to the
            # bench's Nodes and slices too, on the same two cores.
            servers = {
                c["name"]: int(c["pid"])
                for c in recorded["components"]
                if c["name"] != "slice-publisher"
            }
            return asyncio.run(
                _measure(
                    Path(recorded["kubeconfig"]),
                    recorded["nats_url"],
                    n,
                    samples,
                    rounds,
                    servers,
                    busauth.admin_credentials(state),
                )
            )
        finally:
            _cli("dev", "down", "--state-dir", str(state))
