"""Slice publishing for many trn2 nodes against a bare kubernetes-asyncio write loop.

One local stack (its real etcd and kube-apiserver; a single simulated node) holds N Node
objects. In the same run:

* **bare loop**: kubernetes-asyncio's ``ApiClient`` creates the very slice objects the
  publisher would write, with the same concurrency, nothing else;
* **publisher**: N NodeInventory events are published on the bus; the publisher's real
  controller (durable consumer, Node and slice informers, work queue, KubeSliceStore) writes
  every pool. Timed from the first publish to the last pool written.

Then one device change: a new inventory for one node (driver version changed) until its pool
is rewritten, against a bare replace of the same slice (p50/p99 over many samples).
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
from typing import Any

import msgspec

from bench.harness import Figure, Report, percentile

WORKERS = 16
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
            },
        },
    }


def _stat(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` from field 3 (state) on; None when the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """User + system CPU seconds each process has used so far."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for name, pid in pids.items():
        fields = _stat(pid)
        out[name] = (int(fields[11]) + int(fields[12])) / tick if fields else 0.0
    return out


def _cpu_used(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: after[name] - before[name] for name in before}


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
        fields = _stat(pid)
        if fields is None or int(fields[19]) != int(component["start_ticks"]):
            return
        os.kill(pid, signal.SIGTERM)
        for _ in range(200):
            fields = _stat(pid)
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


async def _measure(
    kubeconfig: Path, nats_url: str, n: int, samples: int, servers: dict[str, int]
) -> Report:
    from kubernetes_asyncio import client as k8s
    from kubernetes_asyncio import config as k8s_config
    from neuron_dra_common.bus import Bus, consumer
    from neuron_dra_common.events import NodeInventory
    from neuron_dra_common.hardware.node import read_node
    from neuron_dra_common.hardware.simulate import write_node
    from neuron_dra_common.kube import NODES, RESOURCE_SLICES, Informer, connect, run_workers
    from neuron_dra_slice_publisher.controller import Controller, NodeInfo
    from neuron_dra_slice_publisher.pool import NodeRef, render_slice, slice_summary
    from neuron_dra_slice_publisher.slices import NodeDeviceMode, build_pool
    from neuron_dra_slice_publisher.store import SELECTOR, KubeSliceStore

    with tempfile.TemporaryDirectory() as tmp:
        sim = write_node(Path(tmp), instance_type="trn2.48xlarge", node_name="bench")
        hardware = read_node(sim.root, neuron_ls_command=sim.neuron_ls_command)
    configuration = k8s.Configuration()
    await k8s_config.load_kube_config(
        config_file=str(kubeconfig), client_configuration=configuration
    )
    bare = k8s.ApiClient(configuration)
    kube = await connect(kubeconfig=kubeconfig)
    names = [f"bench-{i:05d}" for i in range(n)]

    async def call(
        method: str, path: str, body: Any = None, query: list[tuple[str, str]] | None = None
    ) -> Any:
        return await bare.call_api(
            path,
            method,
            query_params=query or [],
            header_params={"Content-Type": "application/json", "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
            response_types_map={200: "object", 201: "object"},
            _return_http_data_only=True,
        )

    async def make_node(i: int) -> None:
        await call("POST", "/api/v1/nodes", _node(names[i]))

    await _bounded(n, make_node)
    uids = {o["metadata"]["name"]: o["metadata"]["uid"] for o in (await kube.list(NODES))[0]}

    def bodies(node: str, *, driver: str = "2.24.7.0") -> list[dict[str, Any]]:
        hw = msgspec.structs.replace(hardware, driver_version=driver)
        content = build_pool(
            node=node,
            hardware=hw,
            labels=_node(node)["metadata"]["labels"],
            mode=NodeDeviceMode.COUNTERS,
            dra_driver_version="0.1.0",
        )
        owner = NodeRef(name=node, uid=uids[node])
        count = len(content.slices)
        return [
            render_slice(s, owner=owner, index=i, generation=1, count=count)
            for i, s in enumerate(content.slices)
        ]

    # -- bare loop ---------------------------------------------------------------------------
    prepared = [bodies(name) for name in names]
    slices_path = RESOURCE_SLICES.path()

    async def bare_write(i: int) -> None:
        for body in prepared[i]:
            await call("POST", slices_path, body)

    cpu0, own0 = _cpu_seconds(servers), time.process_time()
    t0 = time.perf_counter()
    await _bounded(n, bare_write)
    bare_seconds = time.perf_counter() - t0
    bare_cpu, bare_own = _cpu_used(cpu0, _cpu_seconds(servers)), time.process_time() - own0
    bare_writes = sum(len(p) for p in prepared)

    bare_change: list[float] = []
    for k in range(samples):
        body = bodies(names[k % n], driver=f"2.30.{k}.0")[0]
        current = await call("GET", f"{slices_path}/{body['metadata']['name']}")
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        t = time.perf_counter()
        await call("PUT", f"{slices_path}/{body['metadata']['name']}", body)
        bare_change.append(time.perf_counter() - t)
    await call("DELETE", slices_path, query=[("labelSelector", SELECTOR)])
    for _ in range(300):  # deletecollection finishes asynchronously
        if not (await kube.list(RESOURCE_SLICES, label_selector=SELECTOR))[0]:
            break
        await asyncio.sleep(0.2)

    # -- the publisher ------------------------------------------------------------------------
    bus = await Bus.connect([nats_url], name="bench-slices")
    await bus.reconcile(consumers=[consumer("slice-publisher-inventory")])
    nodes = Informer(kube, NODES)
    slices = Informer(kube, RESOURCE_SLICES, label_selector=SELECTOR, transform=slice_summary)

    def lookup(name: str) -> NodeInfo | None:
        obj = nodes.cache.get(name)
        return NodeInfo.from_object(obj) if obj is not None else None

    controller = Controller(
        store=KubeSliceStore(kube),
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
    workers = asyncio.create_task(
        run_workers(controller.queue, controller.reconcile, workers=WORKERS), name="bench-workers"
    )
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
            hardware=msgspec.structs.replace(hardware, driver_version=driver),
            dra_driver_version="0.1.0",
        )

    events = [inventory(name, 1, "2.24.7.0") for name in names]
    profile_path = os.environ.get("NEURON_DRA_BENCH_PROFILE", "")
    profiler = cProfile.Profile() if profile_path else None
    cpu0, own0 = _cpu_seconds(servers), time.process_time()
    if profiler is not None:
        profiler.enable()
    t0 = time.perf_counter()
    await publisher.publish_many(events)
    await asyncio.wait_for(done.wait(), timeout=300)
    publisher_seconds = max(written.values()) - t0
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(profile_path)
    pub_cpu, pub_own = _cpu_used(cpu0, _cpu_seconds(servers)), time.process_time() - own0
    pub_writes = sum(len(bodies(name)) for name in names)

    change: list[float] = []
    for k in range(samples):
        node = names[k % n]
        written.pop(node, None)
        done.clear()
        wanted = {node}
        t = time.perf_counter()
        await publisher.publish(inventory(node, 2 + k, f"2.31.{k}.0"))
        await asyncio.wait_for(done.wait(), timeout=30)
        change.append(written[node] - t)

    runner.stop()
    controller.queue.shutdown()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, workers, return_exceptions=True)
    await bus.close()
    await kube.close()
    await bare.close()

    ms = 1000.0
    report = Report(name=f"slices ({n} trn2 nodes, {WORKERS} concurrent writers)")
    report.figures += [
        Figure(
            name="all pools complete",
            unit="s",
            value=publisher_seconds,
            baseline=bare_seconds,
            baseline_name="bare kubernetes-asyncio loop",
            higher_is_better=False,
        ),
        Figure(
            name="device change -> slice p50",
            unit="ms",
            value=percentile(change, 50) * ms,
            baseline=percentile(bare_change, 50) * ms,
            baseline_name="bare replace",
            higher_is_better=False,
        ),
        Figure(
            name="device change -> slice p99",
            unit="ms",
            value=percentile(change, 99) * ms,
            baseline=percentile(bare_change, 99) * ms,
            baseline_name="bare replace",
            higher_is_better=False,
        ),
    ]
    report.notes.append(
        f"goals: all pools within 1.10 x the bare loop (got {publisher_seconds / bare_seconds:.2f}),"
        f" {n} nodes in <= 10 s (got {publisher_seconds:.2f} s)"
    )
    for label, cpu, own, writes, seconds in (
        ("bare loop", bare_cpu, bare_own, bare_writes, bare_seconds),
        ("publisher", pub_cpu, pub_own, pub_writes, publisher_seconds),
    ):
        servers_cpu = ", ".join(f"{k} {v:.1f}" for k, v in cpu.items())
        per_write = 1000.0 * cpu.get("kube-apiserver", 0.0) / max(writes, 1)
        report.notes.append(
            f"{label}: {writes} slice writes in {seconds:.2f} s; CPU s: {servers_cpu}, "
            f"bench process {own:.1f}; apiserver {per_write:.2f} ms CPU per write"
        )
    report.notes.append(
        f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    report.notes.append(json.dumps({"nodes": n, "samples": samples}))
    return report


def run(*, quick: bool) -> Report:
    n, samples = (200, 20) if quick else (1000, 100)
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
            servers = {
                c["name"]: int(c["pid"])
                for c in recorded["components"]
                if c["name"] in ("kube-apiserver", "etcd", "nats")
            }
            return asyncio.run(
                _measure(Path(recorded["kubeconfig"]), recorded["nats_url"], n, samples, servers)
            )
        finally:
            _cli("dev", "down", "--state-dir", str(state))
