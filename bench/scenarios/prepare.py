"""``prepare``: NodePrepareResources through the real DRA sockets, against the upstream test driver.

One local stack (real etcd and kube-apiserver, two simulated trn2 nodes) holds the
ResourceClaims, created with ``status.allocation`` written through the status subresource
as the scheduler would. Two plugins serve the kubelet DRA API (v1) on unix sockets:

* **neuron-dra**: the kubelet plugin, started as the stack starts it (same settings, its
  RBAC-bound identity, the node's simulated hardware, the stack's NATS) but on a kubelet
  root of its own, so no kubelet calls it meanwhile. Its claims name ``neurondevice<i>`` in
  the pool of node 0.
* **test driver**: the upstream DRA test driver (``test/e2e/dra/test-driver``, Go, built at
  the stack's Kubernetes pin) with ``--num-devices=16``; its claims name ``device-<ii>`` in
  the pool of node 1.

The benchmark plays the kubelet: a gRPC client from the generated stubs calls each socket
directly. Every claim is unprepared right after it was prepared, so both drivers do the whole
work on every call (the test driver answers a repeated prepare of a prepared claim from
memory; ours from its checkpoint). Both GET the claim from the API on every prepare.

For claims of 1, 4 and 16 devices:

* **throughput**: ``16 / size`` lanes run concurrently, each on its own devices and cycling
  over its own claims (prepare, then unprepare); claims per second;
* **latency**: NodePrepareResources with one call in flight; p50 and p99.

Both write their CDI specs (and ours its checkpoint) on tmpfs, as a node's ``/run`` is.
Drivers alternate (and swap order every round) so machine load hits both alike; each
plugin's CPU per cycle is a row of the table (beside the test driver's), and every process's
is printed under it. A third server, the **gRPC floor** (:mod:`bench.grpc_floor`), is served
as ours is but answers every claim from memory: its CPU per 1-device cycle is what gRPC in
Python costs before the plugin does any work of its own.
``NEURON_DRA_BENCH_PROFILE=<file>`` runs our plugin under cProfile (timed by its main
thread's CPU clock, :mod:`bench.profiled`) and writes the stats there when it stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from neuron_dra_common.driver import DRIVER_NAME, device_name
from neuron_dra_protos.dra.v1 import dra_pb2 as v1
from neuron_dra_protos.dra.v1 import dra_pb2_grpc as v1_grpc

from bench.harness import Figure, Report, cpu_seconds, cpu_used, percentile


def _cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds each process's threads have run so far, to the nanosecond.

    ``/proc/<pid>/stat`` counts in clock ticks (10 ms): over a quick run's hundred cycles
    that is a tenth of a millisecond per cycle, as much as the figures it would compare.
    The scheduler's own count per thread (``schedstat``) is exact; the threads of these
    processes live as long as they do (a thread that ended would be missing from the sum).
    """
    out: dict[str, float] = {}
    for name, pid in pids.items():
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
            total = 0
            for task in tasks:
                with (
                    contextlib.suppress(FileNotFoundError),
                    open(f"/proc/{pid}/task/{task}/schedstat") as f,
                ):
                    total += int(f.read().split()[0])
            out[name] = total / 1e9
        except (OSError, ValueError, IndexError):
            out[name] = cpu_seconds({name: pid})[name]
    return out


SIZES = (1, 4, 16)
DEVICES = 16
NAMESPACE = "bench-prepare"
REQUEST = "neurons"
OURS = "neuron-dra"
GO = "test driver"
FLOOR = "gRPC floor"
GO_DRIVER = "test-driver.bench.neuron.aws.com"
P99_GOAL_MS = 10.0
_REPO = Path(__file__).resolve().parents[2]
_FLEET = "nodes:\n  - instanceType: trn2.48xlarge\n    count: 2\n"


def _tmpfs() -> str:
    """A tmpfs directory to stand in for a node's /run."""
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if fields[1] == "/dev/shm" and fields[2] == "tmpfs":
            return "/dev/shm"
    raise RuntimeError("no tmpfs at /dev/shm to stand in for a node's /run")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "neuron_dra_cli", *args],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=_REPO,
        env=os.environ.copy(),
    )


@dataclass
class Plugin:
    """One DRA plugin under test: its process, its socket and the claims it may prepare."""

    label: str
    driver: str
    node: str
    device_names: list[str]
    socket: Path
    proc: subprocess.Popen[bytes]
    log: Path
    #: claims[size][lane] -> (name, uid) of the claims that lane cycles over
    claims: dict[int, list[list[tuple[str, str]]]] = field(default_factory=dict)


def _wait_socket(plugin: Plugin, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not plugin.socket.exists():
        if plugin.proc.poll() is not None:
            raise RuntimeError(
                f"{plugin.label} exited with {plugin.proc.returncode} before serving; "
                f"log:\n{plugin.log.read_text()[-4000:]}"
            )
        if time.monotonic() > deadline:
            raise RuntimeError(f"{plugin.label}: no socket {plugin.socket} after {timeout:.0f} s")
        time.sleep(0.05)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _start_ours(*, state: Path, nats_url: str, root: Path, run: Path) -> Plugin:
    from neuron_dra_cli.stack import process
    from neuron_dra_cli.stack.fleet import load_fleet
    from neuron_dra_cli.stack.layout import Layout
    from neuron_dra_cli.stack.plugin import KIND, plugin_component
    from neuron_dra_kubelet_plugin.registration import socket_paths

    layout = Layout(state)
    recorded = json.loads((state / "state.json").read_text())
    node = load_fleet(Path(recorded["fleet"])).nodes[0]
    component = plugin_component(
        node=node,
        layout=layout,
        nats_url=nats_url,
        kubeconfig=layout.component_kubeconfig(KIND),
    )
    kubelet_root = root / "k"
    env = {
        **os.environ,
        **component.env,
        "NEURON_DRA_KUBELET_ROOT": str(kubelet_root),
        "NEURON_DRA_CDI_ROOT": str(run / "cdi"),
        "NEURON_DRA_CHECKPOINT_PATH": str(run / "neuron-dra" / "checkpoint.json"),
        "NEURON_DRA_HTTP_PORT": str(process.free_port()),
        "NEURON_DRA_LOG_LEVEL": "warning",
    }
    argv = list(component.argv)
    profile = os.environ.get("NEURON_DRA_BENCH_PROFILE")
    if profile:
        argv = [argv[0], "-m", "bench.profiled", profile, *argv[1:]]
    root.mkdir(parents=True, exist_ok=True)
    log = root / "ours.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=_REPO)
    plugin = Plugin(
        label=OURS,
        driver=DRIVER_NAME,
        node=node.name,
        device_names=[device_name(i) for i in range(DEVICES)],
        socket=socket_paths(kubelet_root).dra,
        proc=proc,
        log=log,
    )
    _wait_socket(plugin)
    return plugin


def _start_go(*, state: Path, kubeconfig: Path, root: Path, run: Path) -> Plugin:
    from neuron_dra_cli import kubebuild
    from neuron_dra_cli.stack.fleet import load_fleet

    recorded = json.loads((state / "state.json").read_text())
    node = load_fleet(Path(recorded["fleet"])).nodes[1]
    binary = kubebuild.ensure_binaries(recorded["k8s_version"]).dra_test_driver
    plugins = root / "k" / "plugins"
    (plugins / GO_DRIVER).mkdir(parents=True)
    (root / "k" / "plugins_registry").mkdir(parents=True)
    log = root / "go.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                str(binary),
                f"--kubeconfig={kubeconfig}",
                f"--drivername={GO_DRIVER}",
                "kubelet-plugin",
                f"--node-name={node.name}",
                f"--datadir={plugins}",
                f"--plugin-registration-path={root / 'k' / 'plugins_registry'}",
                f"--cdi-dir={run / 'cdi'}",
                f"--num-devices={DEVICES}",
                "--kube-api-qps=100000",
                "--kube-api-burst=100000",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    plugin = Plugin(
        label=GO,
        driver=GO_DRIVER,
        node=node.name,
        device_names=[f"device-{i:02d}" for i in range(DEVICES)],
        socket=plugins / GO_DRIVER / "dra.sock",
        proc=proc,
        log=log,
    )
    _wait_socket(plugin)
    return plugin


def _start_floor(root: Path, per_lane: int, mode: str = "aio") -> Plugin:
    """:mod:`bench.grpc_floor`: what gRPC alone costs, served as our plugin serves (or as
    ``mode`` says: see the module)."""
    root.mkdir(parents=True, exist_ok=True)
    socket = root / "dra.sock"
    log = root / "floor.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.grpc_floor", str(socket), mode],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=_REPO,
        )
    plugin = Plugin(
        label=FLOOR if mode == "aio" else f"{FLOOR} ({mode})",
        driver="",
        node="",
        device_names=[],
        socket=socket,
        proc=proc,
        log=log,
        # No claim in the API: the floor answers any name from memory.
        claims={
            1: [
                [(f"f{lane}-{k}", f"floor-{lane}-{k}") for k in range(per_lane)]
                for lane in range(DEVICES)
            ]
        },
    )
    _wait_socket(plugin)
    return plugin


# -- claims in the apiserver ------------------------------------------------------------------


def _claim(name: str, size: int) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": REQUEST,
                        "exactly": {
                            "deviceClassName": DRIVER_NAME,
                            "allocationMode": "ExactCount",
                            "count": size,
                        },
                    }
                ]
            }
        },
    }


def _allocation(plugin: Plugin, devices: list[str]) -> dict[str, Any]:
    return {
        "devices": {
            "results": [
                {"request": REQUEST, "driver": plugin.driver, "pool": plugin.node, "device": d}
                for d in devices
            ]
        },
        "nodeSelector": {
            "nodeSelectorTerms": [
                {
                    "matchFields": [
                        {"key": "metadata.name", "operator": "In", "values": [plugin.node]}
                    ]
                }
            ]
        },
    }


async def _create_claims(kubeconfig: Path, plugins: list[Plugin], per_lane: int) -> None:
    from neuron_dra_common.kube import RESOURCE_CLAIMS, connect
    from neuron_dra_ultraserver_operator.resources import NAMESPACES

    kube = await connect(kubeconfig=kubeconfig)
    try:
        await kube.create(
            NAMESPACES,
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        )
        sem = asyncio.Semaphore(8)

        async def one(plugin: Plugin, name: str, size: int, devices: list[str]) -> str:
            async with sem:
                created = await kube.create(
                    RESOURCE_CLAIMS, _claim(name, size), namespace=NAMESPACE
                )
                created["status"] = {"allocation": _allocation(plugin, devices)}
                await kube.replace_status(RESOURCE_CLAIMS, name, created, namespace=NAMESPACE)
                return str(created["metadata"]["uid"])

        for plugin in plugins:
            tag = "n" if plugin.label == OURS else "g"
            for size in SIZES:
                lanes = []
                for lane in range(DEVICES // size):
                    devices = plugin.device_names[lane * size : (lane + 1) * size]
                    names = [f"{tag}{size}-{lane}-{k}" for k in range(per_lane)]
                    uids = await asyncio.gather(*(one(plugin, n, size, devices) for n in names))
                    lanes.append(list(zip(names, uids, strict=True)))
                plugin.claims[size] = lanes
    finally:
        await kube.close()


# -- the kubelet's side -----------------------------------------------------------------------


class Caller:
    """Calls one plugin's DRA socket as the kubelet does (v1, one claim per call)."""

    def __init__(self, plugin: Plugin) -> None:
        self.plugin = plugin
        self.channel = grpc.aio.insecure_channel(f"unix://{plugin.socket}")
        self.stub = v1_grpc.DRAPluginStub(self.channel)

    async def prepare(self, name: str, uid: str, size: int) -> float:
        request = v1.NodePrepareResourcesRequest(
            claims=[v1.Claim(namespace=NAMESPACE, name=name, uid=uid)]
        )
        t = time.perf_counter()
        response = await self.stub.NodePrepareResources(request, timeout=30)
        elapsed = time.perf_counter() - t
        entry = response.claims[uid]
        if entry.error or len(entry.devices) != size:
            raise RuntimeError(
                f"{self.plugin.label}: prepare of {NAMESPACE}/{name} answered error "
                f"{entry.error!r} with {len(entry.devices)} devices (wanted {size})"
            )
        return elapsed

    async def unprepare(self, name: str, uid: str) -> float:
        request = v1.NodeUnprepareResourcesRequest(
            claims=[v1.Claim(namespace=NAMESPACE, name=name, uid=uid)]
        )
        t = time.perf_counter()
        response = await self.stub.NodeUnprepareResources(request, timeout=30)
        elapsed = time.perf_counter() - t
        if response.claims[uid].error:
            raise RuntimeError(
                f"{self.plugin.label}: unprepare of {NAMESPACE}/{name} answered error "
                f"{response.claims[uid].error!r}"
            )
        return elapsed

    async def cycles(self, size: int, lane: int, count: int, start: int = 0) -> list[float]:
        """``count`` prepare+unprepare cycles on one lane; the prepare latencies."""
        claims = self.plugin.claims[size][lane]
        out: list[float] = []
        for k in range(start, start + count):
            name, uid = claims[k % len(claims)]
            out.append(await self.prepare(name, uid, size))
            await self.unprepare(name, uid)
        return out

    async def throughput(self, size: int, per_lane: int) -> float:
        """Claims per second with every lane of ``size`` busy at once."""
        lanes = len(self.plugin.claims[size])
        t = time.perf_counter()
        await asyncio.gather(*(self.cycles(size, lane, per_lane) for lane in range(lanes)))
        return lanes * per_lane / (time.perf_counter() - t)

    async def close(self) -> None:
        await self.channel.close()


@dataclass
class Results:
    rates: dict[tuple[str, int], list[float]] = field(default_factory=dict)
    latencies: dict[tuple[str, int], list[float]] = field(default_factory=dict)
    # CPU seconds per cycle during the throughput runs: the plugin, the rest of the stack
    # (apiserver, etcd, NATS) and the bench process (the kubelet's side).
    cpu: dict[tuple[str, int], dict[str, float]] = field(default_factory=dict)
    cycles: dict[tuple[str, int], int] = field(default_factory=dict)
    #: gRPC alone (bench.grpc_floor), 1-device cycles: CPU seconds of its process, cycles,
    #: and cycles per second.
    floor_cpu: float = 0.0
    floor_cycles: int = 0
    floor_rates: list[float] = field(default_factory=list)


async def _measure_floor(
    floor: Plugin, results: Results, *, rounds: int, total_cycles: int
) -> None:
    caller = Caller(floor)
    try:
        await caller.cycles(1, 0, 10)
        await caller.throughput(1, max(1, 20 // DEVICES))
        per_lane = max(1, total_cycles // DEVICES)
        for _ in range(rounds):
            pids = {"plugin": floor.proc.pid}
            cpu0 = _cpu_seconds(pids)
            results.floor_rates.append(await caller.throughput(1, per_lane))
            results.floor_cpu += cpu_used(cpu0, _cpu_seconds(pids))["plugin"]
            results.floor_cycles += per_lane * DEVICES
    finally:
        await caller.close()


async def _measure(
    plugins: list[Plugin],
    *,
    rounds: int,
    latency_samples: int,
    total_cycles: int,
    stack_pids: dict[str, int],
) -> Results:
    callers = [Caller(p) for p in plugins]
    results = Results()
    try:
        for caller in callers:  # warm up: connections, caches, code paths of every size
            for size in SIZES:
                await caller.cycles(size, 0, 10)
                await caller.throughput(size, max(1, 20 // (DEVICES // size)))
        for r in range(rounds):
            order = callers if r % 2 == 0 else callers[::-1]
            for size in SIZES:
                per_lane = max(1, total_cycles // (DEVICES // size))
                for caller in order:
                    key = (caller.plugin.label, size)
                    lat = await caller.cycles(size, 0, latency_samples, start=r * latency_samples)
                    results.latencies.setdefault(key, []).extend(lat)
                    pids = {"plugin": caller.plugin.proc.pid, **stack_pids}
                    cpu0, own0 = _cpu_seconds(pids), time.process_time()
                    rate = await caller.throughput(size, per_lane)
                    used = cpu_used(cpu0, _cpu_seconds(pids))
                    used["bench client"] = time.process_time() - own0
                    results.rates.setdefault(key, []).append(rate)
                    total = results.cpu.setdefault(key, {})
                    for name, seconds in used.items():
                        total[name] = total.get(name, 0.0) + seconds
                    results.cycles[key] = results.cycles.get(key, 0) + per_lane * (DEVICES // size)
    finally:
        for caller in callers:
            await caller.close()
    return results


def _report(
    results: Results,
    *,
    load_before: tuple[float, ...],
    load_after: tuple[float, ...],
    settings: dict[str, int],
) -> Report:
    report = Report(name="prepare (NodePrepareResources over the DRA socket, v1, 1 claim/call)")
    ms = 1000.0
    verdicts: list[str] = []
    for size in SIZES:
        ours_rate = sorted(results.rates[(OURS, size)])[len(results.rates[(OURS, size)]) // 2]
        go_rate = sorted(results.rates[(GO, size)])[len(results.rates[(GO, size)]) // 2]
        ours_lat, go_lat = results.latencies[(OURS, size)], results.latencies[(GO, size)]
        lanes = DEVICES // size
        report.figures += [
            Figure(
                name=f"{size}-device claims, {lanes} lane(s): throughput",
                unit="claims/s",
                value=ours_rate,
                baseline=go_rate,
                baseline_name=GO,
            ),
            Figure(
                name=f"{size}-device claims: prepare p50",
                unit="ms",
                value=percentile(ours_lat, 50) * ms,
                baseline=percentile(go_lat, 50) * ms,
                baseline_name=GO,
                higher_is_better=False,
            ),
            Figure(
                name=f"{size}-device claims: prepare p99",
                unit="ms",
                value=percentile(ours_lat, 99) * ms,
                baseline=percentile(go_lat, 99) * ms,
                baseline_name=GO,
                higher_is_better=False,
            ),
        ]
        ours_cpu = results.cpu[(OURS, size)].get("plugin", 0.0) / results.cycles[(OURS, size)]
        go_cpu = results.cpu[(GO, size)].get("plugin", 0.0) / results.cycles[(GO, size)]
        report.figures.append(
            Figure(
                name=f"{size}-device claims: plugin CPU per cycle",
                unit="ms",
                value=ours_cpu * ms,
                baseline=go_cpu * ms,
                baseline_name=GO,
                higher_is_better=False,
            )
        )
        verdicts.append(
            f"{size}: {ours_rate / go_rate:.2f}x throughput, "
            f"p99 {percentile(ours_lat, 99) * ms:.1f} ms, "
            f"plugin CPU {ours_cpu * ms:.2f} ms/cycle (test driver {go_cpu * ms:.2f})"
        )
    report.notes.append(
        "goals: >= 1.00x the test driver's throughput, p99 <= "
        f"{P99_GOAL_MS:.0f} ms; got " + "; ".join(verdicts)
    )
    for size in SIZES:
        parts = []
        for label in (OURS, GO):
            key = (label, size)
            per = {k: v / results.cycles[key] * ms for k, v in results.cpu[key].items()}
            parts.append(f"{label} " + ", ".join(f"{k} {v:.2f}" for k, v in per.items()))
        report.notes.append(f"CPU ms per {size}-device cycle: " + "; ".join(parts))
    if results.floor_cycles:
        floor_cpu = results.floor_cpu / results.floor_cycles
        go_cpu = results.cpu[(GO, 1)].get("plugin", 0.0) / results.cycles[(GO, 1)]
        report.figures.append(
            Figure(
                name="1-device claims: gRPC floor CPU per cycle",
                unit="ms",
                value=floor_cpu * ms,
                baseline=go_cpu * ms,
                baseline_name=GO,
                higher_is_better=False,
            )
        )
        ours_cpu = results.cpu[(OURS, 1)].get("plugin", 0.0) / results.cycles[(OURS, 1)]
        rate = sorted(results.floor_rates)[len(results.floor_rates) // 2]
        report.notes.append(
            f"gRPC floor (bench.grpc_floor: the same grpc.aio server and uvloop, every claim "
            f"answered from memory): {floor_cpu * ms:.2f} ms CPU per 1-device cycle, "
            f"{rate:.0f} cycles/s; the plugin's own work is the rest of its "
            f"{ours_cpu * ms:.2f} ms"
        )
    report.notes.append(
        "throughput: every lane prepares then unprepares its claims (a cycle per claim); "
        "median of the rounds. latency: one call in flight."
    )
    report.notes.append(
        "load average (1, 5, 15 min): before "
        + ", ".join(f"{x:.2f}" for x in load_before)
        + "; after "
        + ", ".join(f"{x:.2f}" for x in load_after)
        + f" ({os.cpu_count()} CPUs)"
    )
    report.notes.append(json.dumps(settings))
    return report


def run(*, quick: bool) -> Report:
    rounds, latency_samples, total_cycles, per_lane = (1, 100, 96, 4) if quick else (3, 300, 320, 8)
    load_before = os.getloadavg()
    # Unix socket paths are limited to 107 bytes: keep the plugins' roots short.
    tmp = Path(tempfile.mkdtemp(prefix="bprep-", dir="/tmp"))
    # CDI specs and our checkpoint on tmpfs, as on a node (/run): both drivers alike.
    run = Path(tempfile.mkdtemp(prefix="bprep-", dir=_tmpfs()))
    state = tmp / "stack"
    fleet = tmp / "fleet.yaml"
    fleet.write_text(_FLEET)
    plugins: list[Plugin] = []
    up = _cli("dev", "up", "--detach", "--state-dir", str(state), "--fleet", str(fleet))
    try:
        if up.returncode != 0:
            raise RuntimeError(f"dev up failed:\n{up.stdout}\n{up.stderr}")
        recorded = json.loads((state / "state.json").read_text())
        kubeconfig = Path(recorded["kubeconfig"])
        plugins.append(
            _start_ours(state=state, nats_url=recorded["nats_url"], root=tmp / "n", run=run / "n")
        )
        plugins.append(_start_go(state=state, kubeconfig=kubeconfig, root=tmp / "g", run=run / "g"))
        asyncio.run(_create_claims(kubeconfig, plugins, per_lane))
        measured = list(plugins)
        floor = _start_floor(tmp / "f", per_lane)
        plugins.append(floor)
        stack_pids = {
            c["name"]: int(c["pid"])
            for c in recorded["components"]
            if c["name"] in ("kube-apiserver", "etcd", "nats")
        }

        async def measure() -> Results:
            results = await _measure(
                measured,
                rounds=rounds,
                latency_samples=latency_samples,
                total_cycles=total_cycles,
                stack_pids=stack_pids,
            )
            await _measure_floor(floor, results, rounds=rounds, total_cycles=total_cycles)
            return results

        results = asyncio.run(measure())
    finally:
        for plugin in plugins:
            _stop(plugin.proc)
        _cli("dev", "down", "--state-dir", str(state))
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(run, ignore_errors=True)
    return _report(
        results,
        load_before=load_before,
        load_after=os.getloadavg(),
        settings={
            "rounds": rounds,
            "latency_samples": latency_samples,
            "cycles_per_size": total_cycles,
            "claims_per_lane": per_lane,
        },
    )
