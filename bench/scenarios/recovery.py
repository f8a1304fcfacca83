"""Recovery: device fault -> taint, node killed -> declared lost -> workload re-allocated on the
spare -> its pods Running, against Kubernetes' own path for the same node in the same run.

One local stack (``dev up``: the real control plane, simulated nodes running the kubelet's
code, the neuron-dra services as they run there) with one trn2.48xlarge node for device
faults and one UltraServer more than there are node-loss repetitions (a lost node comes back
only with a new ``dev up``, so every repetition moves the workload to a fresh spare).

* **device faults**: an uncorrectable SRAM error on one device of the trn2 node (the driver's
  kernel log line and counter, made as ``neuron-dra dev fault`` makes them), timed until a
  watch shows the device's ``neuron.aws.com/hardware-error`` taint on its ResourceSlice; then
  a repair, timed until the taint is gone.
* **node loss**: a ``NeuronUltraServerWorkload`` of 1 x 4 nodes (``ReplaceAffected``) with a
  Deployment of four pods; a node of it is killed as ``dev fault NODE lost`` kills one (its
  kubelet and agents, SIGKILL). Timed from the kill: ``NodeLost`` on the bus, the node's
  devices tainted ``neuron.aws.com/node-lost``, the workload ``Degraded``, the workload
  ``Allocated`` on another UltraServer, and its four pods Running there. Kubernetes' own path
  for the same node, in the same repetition: the Node's ``Ready`` condition no longer True,
  its ``node.kubernetes.io/unreachable`` taint, and the eviction of a pod bound to that node
  that tolerates the taint for 0 s (by default a pod tolerates it for 300 s).

Every time is taken when the event reaches this process (a watch on the apiserver, or an
ordered consumer on the bus), from just before the fault is made.

``--quick``: 10 device faults and 3 nodes killed (4 UltraServers, 17 simulated nodes); the
full run: 40 and 10 (11 UltraServers, 45 nodes). Either takes minutes, not seconds: each node
loss waits for Kubernetes' own path, which its 50 s grace period sets.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

import msgspec
from neuron_dra_cli.fault_cmd import LOST, apply_fault
from neuron_dra_cli.stack import busauth
from neuron_dra_common.bus import Bus
from neuron_dra_common.events import AnyEvent, DeviceHealthChanged, NodeLost
from neuron_dra_common.kube import (
    NODES,
    RESOURCE_SLICES,
    ApiException,
    KubeClient,
    Resource,
    connect,
)
from neuron_dra_ultraserver_operator.resources import NAMESPACES, NUSW, PODS

from bench.harness import Figure, Report, percentile
from bench.stack import local_stack
from bench.watch import BusEvents, Watched, wait

Obj = dict[str, Any]

NAMESPACE: Final = "bench-recovery"
SERVICE_ACCOUNTS: Final = Resource(
    group="", version="v1", plural="serviceaccounts", kind="ServiceAccount", namespaced=True
)
DEPLOYMENTS: Final = Resource(
    group="apps", version="v1", plural="deployments", kind="Deployment", namespaced=True
)
WORKLOAD: Final = "recover"
REPLICAS: Final = 4
DEVICE_NODE: Final = "trn2-48xl-0"
DEVICE_FAULT: Final = "sram"
HARDWARE_ERROR: Final = "neuron.aws.com/hardware-error"
NODE_LOST: Final = "neuron.aws.com/node-lost"
UNREACHABLE: Final = "node.kubernetes.io/unreachable"
IMAGE: Final = "public.ecr.aws/docker/library/alpine:latest"
#: The recovery goals, in seconds, on p99.
GOAL_TAINT: Final = 1.0
GOAL_DECLARED: Final = 5.0
GOAL_REALLOCATED: Final = 3.0
#: Longest waits: our path, and Kubernetes' (its node grace period is 50 s by default).
OUR_TIMEOUT: Final = 120.0
KUBE_TIMEOUT: Final = 240.0
SETUP_TIMEOUT: Final = 300.0
_KUBE: Final = "Kubernetes"


# --- what the bench sends and how it reads what it sees (no I/O) ---------------------------


def fleet_yaml(ultraservers: int) -> str:
    """One trn2 node for device faults and ``ultraservers`` UltraServers of four nodes."""
    return (
        "region: us-west-2\n"
        "nodes:\n  - instanceType: trn2.48xlarge\n    count: 1\n"
        f"ultraServers:\n  - instanceType: trn2u.48xlarge\n    count: {ultraservers}\n"
    )


def workload_body() -> Obj:
    return {
        "apiVersion": f"{NUSW.group}/{NUSW.version}",
        "kind": "NeuronUltraServerWorkload",
        "metadata": {"name": WORKLOAD, "namespace": NAMESPACE},
        "spec": {
            "instanceType": "trn2u.48xlarge",
            "topologySize": 4,
            "serverCount": 1,
            "allocationPolicy": {"failureStrategy": "ReplaceAffected"},
            "resourceClaimTemplate": {"name": f"{WORKLOAD}-rct"},
        },
    }


def deployment_body() -> Obj:
    """Four pods, one per node, each with a claim from the workload's template."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": WORKLOAD, "namespace": NAMESPACE},
        "spec": {
            "replicas": REPLICAS,
            "selector": {"matchLabels": {"app": WORKLOAD}},
            "template": {
                "metadata": {"labels": {"app": WORKLOAD}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "resourceClaims": [
                        {"name": "neuron", "resourceClaimTemplateName": f"{WORKLOAD}-rct"}
                    ],
                    "containers": [
                        {
                            "name": "training",
                            "image": IMAGE,
                            "command": ["sleep", "infinity"],
                            "resources": {"claims": [{"name": "neuron"}]},
                        }
                    ],
                },
            },
        },
    }


def witness_body(name: str, *, node: str) -> Obj:
    """A pod bound to ``node`` that Kubernetes evicts as soon as the node is unreachable."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"bench": "witness"}},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 1,
            "tolerations": [
                {
                    "key": UNREACHABLE,
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 0,
                }
            ],
            "containers": [{"name": "witness", "image": IMAGE, "command": ["sleep", "infinity"]}],
        },
    }


def _conditions(obj: Obj) -> dict[str, str]:
    found = (obj.get("status") or {}).get("conditions") or ()
    return {str(c.get("type")): str(c.get("status")) for c in found}


def not_ready(node: Obj) -> bool:
    """The Node's ``Ready`` condition is False or Unknown (what ``kubectl get nodes`` shows
    as NotReady)."""
    return _conditions(node).get("Ready", "Unknown") != "True"


def node_tainted(node: Obj, key: str) -> bool:
    return any(t.get("key") == key for t in (node.get("spec") or {}).get("taints") or ())


def device_taints(slices: Iterable[Obj], node: str) -> dict[str, list[Obj]]:
    """Device name -> its taints, in the newest generation of ``node``'s pool."""
    pool = [s for s in slices if ((s.get("spec") or {}).get("pool") or {}).get("name") == node]
    if not pool:
        return {}
    top = max(int(s["spec"]["pool"].get("generation") or 0) for s in pool)
    return {
        str(d.get("name")): list(d.get("taints") or ())
        for s in pool
        if int(s["spec"]["pool"].get("generation") or 0) == top
        for d in s["spec"].get("devices") or ()
    }


def device_tainted(slices: Iterable[Obj], node: str, *, device: str | None, key: str) -> bool:
    """Whether ``device`` (any device when None) of ``node``'s pool carries a taint ``key``."""
    taints = device_taints(slices, node)
    chosen = taints.values() if device is None else [taints.get(device, [])]
    return any(t.get("key") == key for found in chosen for t in found)


def device_listed_clean(slices: Iterable[Obj], node: str, *, device: str, key: str) -> bool:
    """``device`` is in ``node``'s pool without a taint ``key`` (the repair is visible)."""
    taints = device_taints(slices, node)
    return device in taints and not any(t.get("key") == key for t in taints[device])


def evicted(pods: Mapping[str, Obj], key: str) -> bool:
    """The pod is being deleted (Kubernetes' taint eviction sets its deletion time) or gone."""
    pod = pods.get(key)
    return pod is None or bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def running_pods(pods: Iterable[Obj], app: str) -> dict[str, str]:
    """Pod name -> node of ``app``'s Running pods that are not being deleted."""
    return {
        str(p["metadata"]["name"]): str((p.get("spec") or {}).get("nodeName") or "")
        for p in pods
        if (p["metadata"].get("labels") or {}).get("app") == app
        and (p.get("status") or {}).get("phase") == "Running"
        and not p["metadata"].get("deletionTimestamp")
    }


def pods_running_away(pods: Iterable[Obj], app: str, *, avoid: Iterable[str]) -> bool:
    """All :data:`REPLICAS` pods of ``app`` Running, none on a node in ``avoid``."""
    running = running_pods(pods, app)
    return len(running) == REPLICAS and not set(running.values()) & set(avoid)


def allocated_nodes(workload: Obj) -> list[str]:
    allocations = (workload.get("status") or {}).get("allocations") or ()
    return [str(n["nodeName"]) for a in allocations for n in a.get("nodes") or ()]


def allocated_elsewhere(workload: Obj | None, *, old: str) -> bool:
    """State ``Allocated`` on UltraServers that no longer include ``old``."""
    status = (workload or {}).get("status") or {}
    servers = status.get("allocatedUltraServers") or []
    return status.get("state") == "Allocated" and bool(servers) and old not in servers


def degraded(workload: Obj | None) -> bool:
    return _conditions(workload or {}).get("Degraded") == "True"


def replacing(workload: Obj | None) -> bool:
    """The operator has its replacement from the allocator and is binding the new nodes."""
    return ((workload or {}).get("status") or {}).get("reason") == "Replacing"


# --- the figures (no I/O) ------------------------------------------------------------------


class DeviceRun(msgspec.Struct, frozen=True, kw_only=True):
    """One device fault, seconds from the fault: ``DeviceHealthChanged`` on the bus, the
    taint on the slice; and from the repair, the taint gone."""

    device: str
    bus: float
    taint: float
    untaint: float


class LossRun(msgspec.Struct, frozen=True, kw_only=True):
    """One node killed, seconds from the kill, our path and Kubernetes' own."""

    node: str
    old: str
    new: str
    declared: float  # NodeLost on the bus
    devices_tainted: float  # the node's devices tainted neuron.aws.com/node-lost
    degraded: float  # the workload's Degraded condition True
    replacing: float  # the replacement granted (reason Replacing)
    reallocated: float  # the workload Allocated on another UltraServer
    running: float  # its four pods Running there
    not_ready: float  # the Node's Ready condition not True
    unreachable: float  # node.kubernetes.io/unreachable on the Node
    evicted: float  # the witness pod evicted

    @property
    def declared_to_reallocated(self) -> float:
        return self.reallocated - self.declared

    @property
    def not_ready_to_evicted(self) -> float:
        return self.evicted - self.not_ready


def p50_p99(values: list[float]) -> str:
    """``p50 / p99`` in seconds, for the notes.

    >>> p50_p99([0.25, 0.5, 1.0])
    '0.50 / 1.00 s'
    """
    if not values:
        return "-"
    return f"{percentile(values, 50):.2f} / {percentile(values, 99):.2f} s"


def goal_line(what: str, values: list[float], *, goal: float) -> str:
    """The goal on p99, what was measured, and whether it is met.

    >>> goal_line("x", [0.5, 2.0], goal=1.0)
    'goal: x p99 <= 1.0 s: got 2.00 s (2 runs): NOT met'
    """
    if not values:
        return f"goal: {what} p99 <= {goal:.1f} s: not measured"
    got = percentile(values, 99)
    verdict = "met" if got <= goal else "NOT met"
    return f"goal: {what} p99 <= {goal:.1f} s: got {got:.2f} s ({len(values)} runs): {verdict}"


def _pair(name: str, ours: list[float], kube: list[float], *, baseline_name: str) -> list[Figure]:
    return [
        Figure(
            name=f"{name} p{p}",
            unit="ms",
            value=percentile(ours, p) * 1000,
            baseline=percentile(kube, p) * 1000,
            baseline_name=baseline_name,
            higher_is_better=False,
        )
        for p in (50, 99)
    ]


def build_report(devices: list[DeviceRun], losses: list[LossRun]) -> Report:
    """The table: each step of our path against Kubernetes' comparable step, p50 and p99."""
    report = Report(
        name=f"recovery ({len(devices)} device faults, {len(losses)} nodes killed,"
        " 1 x 4 trn2u ReplaceAffected)"
    )
    unreachable = [r.unreachable for r in losses]
    not_ready = [r.not_ready for r in losses]
    report.figures += _pair(
        "device fault -> device taint",
        [r.taint for r in devices],
        unreachable,
        baseline_name=f"{_KUBE}: node killed -> unreachable taint",
    )
    report.figures += _pair(
        "node killed -> declared lost",
        [r.declared for r in losses],
        not_ready,
        baseline_name=f"{_KUBE}: node killed -> NotReady",
    )
    report.figures += _pair(
        "node killed -> its devices tainted",
        [r.devices_tainted for r in losses],
        unreachable,
        baseline_name=f"{_KUBE}: node killed -> unreachable taint",
    )
    report.figures += _pair(
        "declared -> re-allocated on the spare",
        [r.declared_to_reallocated for r in losses],
        [r.not_ready_to_evicted for r in losses],
        baseline_name=f"{_KUBE}: NotReady -> pod evicted",
    )
    report.figures += _pair(
        "node killed -> pods Running on the spare",
        [r.running for r in losses],
        [r.evicted for r in losses],
        baseline_name=f"{_KUBE}: node killed -> pod evicted",
    )
    report.notes += [
        goal_line("device fault -> taint", [r.taint for r in devices], goal=GOAL_TAINT),
        goal_line("node lost -> declared", [r.declared for r in losses], goal=GOAL_DECLARED),
        goal_line(
            "declared -> re-allocated",
            [r.declared_to_reallocated for r in losses],
            goal=GOAL_REALLOCATED,
        ),
        "stages, p50 / p99:",
        f"  device fault -> DeviceHealthChanged on the bus  {p50_p99([r.bus for r in devices])}",
        f"  device repair -> taint gone                     {p50_p99([r.untaint for r in devices])}",
        f"  node killed -> workload Degraded                {p50_p99([r.degraded for r in losses])}",
        f"  node killed -> replacement granted (Replacing)  {p50_p99([r.replacing for r in losses])}",
        f"  node killed -> workload Allocated on the spare  {p50_p99([r.reallocated for r in losses])}",
        f"  declared -> pods Running on the spare           "
        f"{p50_p99([r.running - r.declared for r in losses])}",
        f"  {_KUBE}: NotReady -> unreachable taint          "
        f"{p50_p99([r.unreachable - r.not_ready for r in losses])}",
        "each node killed (s from the kill: declared, re-allocated, pods Running | NotReady,"
        " unreachable, evicted):",
        *(
            f"  {r.node} ({r.old} -> {r.new}): {r.declared:.2f}, {r.reallocated:.2f},"
            f" {r.running:.2f} | {r.not_ready:.2f}, {r.unreachable:.2f}, {r.evicted:.2f}"
            for r in losses
        ),
        "Kubernetes' path: kube-controller-manager runs with its defaults on the local stack"
        " (--node-monitor-grace-period 50 s, --node-monitor-period 5 s); the witness pod"
        " tolerates the unreachable taint for 0 s, where a pod by default tolerates it for"
        " 300 s (DefaultTolerationSeconds), which its eviction would take on top.",
        "device fault -> taint has no Kubernetes counterpart (Kubernetes does not watch"
        " devices): its baseline is the nearest thing Kubernetes does for failed hardware,"
        " the unreachable taint on a dead node.",
        f"load average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs;"
        " with few runs p99 is the slowest run",
    ]
    return report


# --- the run -------------------------------------------------------------------------------


def _say(line: str) -> None:
    """Progress on stderr: a run takes minutes, the table comes at the end."""
    print(f"recovery: {line}", file=sys.stderr, flush=True)


class Bench:
    def __init__(self, *, kube: KubeClient, bus: Bus, state_dir: Path) -> None:
        self.kube = kube
        self.state_dir = state_dir
        self.nodes = Watched(kube, NODES)
        self.slices = Watched(kube, RESOURCE_SLICES)
        self.pods = Watched(kube, PODS, namespace=NAMESPACE)
        self.workloads = Watched(kube, NUSW, namespace=NAMESPACE)
        self.health = BusEvents(bus, stream="NEURON_HEALTH", subject="neuron.health.>")

    @property
    def workload(self) -> Obj | None:
        return self.workloads.objects.get(f"{NAMESPACE}/{WORKLOAD}")

    async def start(self) -> list[asyncio.Task[None]]:
        tasks = [
            asyncio.create_task(w.run(), name=f"bench-watch-{label}")
            for label, w in (
                ("nodes", self.nodes),
                ("slices", self.slices),
                ("pods", self.pods),
                ("workloads", self.workloads),
            )
        ]
        tasks.append(asyncio.create_task(self.health.follower.run(), name="bench-bus-health"))
        for w in (self.nodes, self.slices, self.pods, self.workloads):
            await w.started.wait()
        await self.health.follower.wait_caught_up()
        return tasks

    async def namespace(self) -> None:
        await self.kube.create(NAMESPACES, {"metadata": {"name": NAMESPACE}})
        deadline = time.monotonic() + SETUP_TIMEOUT
        while True:
            try:
                await self.kube.get(SERVICE_ACCOUNTS, "default", namespace=NAMESPACE)
                return
            except ApiException as exc:
                if exc.status != 404 or time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.5)

    async def pool_ready(self) -> None:
        await wait(
            self.slices.expect(
                f"the pool of {DEVICE_NODE}",
                lambda s: bool(device_taints(s.values(), DEVICE_NODE)),
            ),
            what=f"the ResourceSlices of {DEVICE_NODE}",
            within=SETUP_TIMEOUT,
        )

    async def device_fault(self, index: int) -> DeviceRun:
        device = f"neurondevice{index}"

        def health(e: AnyEvent) -> bool:
            return (
                isinstance(e, DeviceHealthChanged)
                and e.node == DEVICE_NODE
                and e.health == "Unhealthy"
            )

        on_bus = self.health.expect(f"DeviceHealthChanged of {DEVICE_NODE}", health)
        tainted = self.slices.expect(
            f"{HARDWARE_ERROR} on {DEVICE_NODE}/{device}",
            lambda s: device_tainted(s.values(), DEVICE_NODE, device=device, key=HARDWARE_ERROR),
        )
        t0 = time.perf_counter()
        apply_fault(self.state_dir, node=DEVICE_NODE, fault=DEVICE_FAULT, device=index)
        taint = await wait(tainted, what=f"{DEVICE_NODE}/{device} tainted", within=OUR_TIMEOUT)
        bus = await wait(on_bus, what=f"{DEVICE_NODE}/{device} unhealthy", within=OUR_TIMEOUT)
        clean = self.slices.expect(
            f"{DEVICE_NODE}/{device} without {HARDWARE_ERROR}",
            lambda s: device_listed_clean(
                s.values(), DEVICE_NODE, device=device, key=HARDWARE_ERROR
            ),
        )
        t1 = time.perf_counter()
        apply_fault(self.state_dir, node=DEVICE_NODE, fault="repair", device=index)
        untaint = await wait(clean, what=f"{DEVICE_NODE}/{device} repaired", within=OUR_TIMEOUT)
        return DeviceRun(device=device, bus=bus - t0, taint=taint - t0, untaint=untaint - t1)

    async def deploy(self) -> None:
        """The workload and its pods, Running on the nodes it was given."""
        await self.kube.create(NUSW, workload_body(), namespace=NAMESPACE)
        await self.kube.create(DEPLOYMENTS, deployment_body(), namespace=NAMESPACE)
        await wait(
            self.workloads.expect(
                f"{WORKLOAD} Allocated",
                lambda _: (self.workload or {}).get("status", {}).get("state") == "Allocated",
            ),
            what=f"NeuronUltraServerWorkload {NAMESPACE}/{WORKLOAD} Allocated",
            within=SETUP_TIMEOUT,
        )
        nodes = set(allocated_nodes(self.workload or {}))
        await wait(
            self.pods.expect(
                "pods Running",
                lambda p: (
                    set(running_pods(p.values(), WORKLOAD).values()) <= nodes
                    and len(running_pods(p.values(), WORKLOAD)) == REPLICAS
                ),
            ),
            what=f"{REPLICAS} pods of {WORKLOAD} Running on {sorted(nodes)}",
            within=SETUP_TIMEOUT,
        )

    async def witness(self, name: str, node: str) -> None:
        await self.kube.create(PODS, witness_body(name, node=node), namespace=NAMESPACE)
        key = f"{NAMESPACE}/{name}"
        await wait(
            self.pods.expect(
                f"{name} Running",
                lambda p: (p.get(key) or {}).get("status", {}).get("phase") == "Running",
            ),
            what=f"pod {key} Running on {node}",
            within=SETUP_TIMEOUT,
        )

    async def lose_node(self, run: int) -> LossRun:
        workload = self.workload or {}
        old = str(workload["status"]["allocatedUltraServers"][0])
        old_nodes = allocated_nodes(workload)
        victim = old_nodes[run % len(old_nodes)]
        witness = f"witness-{run}"
        await self.witness(witness, victim)
        key = f"{NAMESPACE}/{witness}"
        ours = {
            "declared": self.health.expect(
                f"NodeLost {victim}", lambda e: isinstance(e, NodeLost) and e.node == victim
            ),
            "devices_tainted": self.slices.expect(
                f"{NODE_LOST} on {victim}",
                lambda s: device_tainted(s.values(), victim, device=None, key=NODE_LOST),
            ),
            "degraded": self.workloads.expect("Degraded", lambda _: degraded(self.workload)),
            # Seen with the Allocated status at the latest, should the watch skip a step.
            "replacing": self.workloads.expect(
                "Replacing",
                lambda _: replacing(self.workload) or allocated_elsewhere(self.workload, old=old),
            ),
            "reallocated": self.workloads.expect(
                f"Allocated off {old}", lambda _: allocated_elsewhere(self.workload, old=old)
            ),
            "running": self.pods.expect(
                f"pods Running off {old}",
                lambda p: pods_running_away(p.values(), WORKLOAD, avoid=old_nodes),
            ),
        }
        theirs = {
            "not_ready": self.nodes.expect(
                f"{victim} NotReady", lambda n: not_ready(n.get(f"/{victim}") or {})
            ),
            "unreachable": self.nodes.expect(
                f"{UNREACHABLE} on {victim}",
                lambda n: node_tainted(n.get(f"/{victim}") or {}, UNREACHABLE),
            ),
            "evicted": self.pods.expect(f"{witness} evicted", lambda p: evicted(p, key)),
        }
        t0 = time.perf_counter()
        apply_fault(self.state_dir, node=victim, fault=LOST)
        seen: dict[str, float] = {}
        for limit, futures in ((OUR_TIMEOUT, ours), (KUBE_TIMEOUT, theirs)):
            for stage, future in futures.items():
                seen[stage] = await wait(future, what=f"{stage} ({victim})", within=limit) - t0
        new = str(
            ((self.workload or {}).get("status") or {}).get("allocatedUltraServers", ["?"])[0]
        )
        return LossRun(node=victim, old=old, new=new, **seen)


async def _measure(recorded: Obj, *, device_runs: int, loss_runs: int) -> Report:
    kube = await connect(kubeconfig=recorded["kubeconfig"])
    bus = await Bus.connect(
        [recorded["nats_url"]],
        name="bench-recovery",
        credentials=busauth.admin_credentials(Path(recorded["state_dir"])),
    )
    bench = Bench(kube=kube, bus=bus, state_dir=Path(recorded["state_dir"]))
    tasks: list[asyncio.Task[None]] = []
    try:
        tasks = await bench.start()
        await bench.namespace()
        await bench.pool_ready()
        devices = []
        for i in range(device_runs):
            devices.append(await bench.device_fault(i % 16))
            _say(f"device fault {i + 1}/{device_runs}: taint after {devices[-1].taint:.2f} s")
        await bench.deploy()
        _say(f"workload {NAMESPACE}/{WORKLOAD} Allocated, its pods Running")
        losses = []
        for i in range(loss_runs):
            losses.append(await bench.lose_node(i))
            r = losses[-1]
            _say(
                f"node killed {i + 1}/{loss_runs} ({r.node}): declared after {r.declared:.2f} s,"
                f" re-allocated {r.reallocated:.2f} s; NotReady after {r.not_ready:.2f} s"
            )
        for task in tasks:
            if task.done():
                task.result()  # a watch failed: say why
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await bus.close()
        await kube.close()
    return build_report(devices, losses)


def run(*, quick: bool) -> Report:
    device_runs, loss_runs = (10, 3) if quick else (40, 10)
    _say(f"starting a local stack with {loss_runs + 1} UltraServers (dev up)")
    with (
        tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmp,
        local_stack(Path(tmp), fleet=fleet_yaml(loss_runs + 1)) as recorded,
    ):
        _say("stack up")
        return asyncio.run(_measure(recorded, device_runs=device_runs, loss_runs=loss_runs))
