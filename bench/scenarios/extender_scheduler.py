"""The extender through the real kube-scheduler: pods/s with it, against the same pods without it.

A bare control plane (:mod:`bench.control_plane`: the cached build's etcd and kube-apiserver)
holds Node objects of the ``extender`` scenario's fleet, with the Neuron capacity and the
instance-type label AWS's device plugin and the extender read. No kubelet: a pod counts as
scheduled once it is bound (``spec.nodeName`` set), which is where the scheduler's work ends.

Four runs, one after another on the same nodes, each with the same pods (the scenario's mix
of device and NeuronCore counts, as many pods as nodes so that every one of them finds a
connected set under the extender too):

- **alone**: kube-scheduler with the component's ``default-scheduler`` configuration minus its
  extender (its own NodeResourcesFit counts ``aws.amazon.com/neuron`` as a number);
- **no-op extender**: the component's ``my-scheduler`` configuration calling
  :mod:`bench.noop_extender`, which keeps every node, scores none and only binds: what any
  HTTP extender costs the scheduler, so the most an extender can reach here;
- **node names**: the component's ``my-scheduler`` configuration (``nodeCacheCapable: true``);
- **default scheduler**: the component's ``default-scheduler`` configuration (the cluster's
  own scheduler, ``nodeCacheCapable: true`` too);
- **full Nodes**: that configuration with ``nodeCacheCapable: false``, as one written for
  AWS's extension may have it (every call carries the Node objects): not the component's;

the three last with the extender service itself, started afresh for the run, over HTTP, binding
the pods and writing their annotations. In each run the pods are created before the scheduler
starts, a watch takes the arrival time of each pod's first bound version, and pods/s is the
pods after the first over the time from the first bind to the last: the scheduler draining a
full queue, neither its start nor the creation of the pods (a Python client on this machine
creates pods more slowly than kube-scheduler alone binds them) in the figure. The schedulers'
client limits are raised (``clientConnection.qps``) in every run: kube-scheduler's default of
50 requests/s would cap the run without the extender at 50 binds/s, while with it the extender
binds with a client of its own.

A drain of 1,000 pods takes the scheduler alone about 3 s, and two runs of the same code a
minute apart differ by a quarter on a shared two-core machine: the four runs are made in
:data:`ROUNDS` rounds, interleaved, and each figure is the median of its rounds.
"""

from __future__ import annotations

import asyncio
import copy
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec
import yaml
from neuron_dra_cli.stack import components, probes, process, realdeviceplugin
from neuron_dra_common.kube import NODES, KubeClient, Resource, load_kubeconfig
from neuron_dra_common.topology import instance_spec, logical_cores_per_device
from neuron_dra_scheduler_extender.cluster import PODS
from prometheus_client.parser import text_string_to_metric_families

from bench.control_plane import ControlPlane, control_plane
from bench.harness import Figure
from bench.stack import REPO

__all__ = [
    "Binds",
    "Outcome",
    "Run",
    "drain_rate",
    "measure",
    "node_object",
    "pod_object",
    "refused_binds",
    "report",
    "scheduler_config",
]

Obj = dict[str, Any]

COMPONENT = REPO / "deploy" / "kustomize" / "components" / "scheduler-extender"
NAMESPACE = "bench-scheduling"
NAMESPACES = Resource(group="", version="v1", plural="namespaces", kind="Namespace")
SERVICE_ACCOUNTS = Resource(
    group="", version="v1", plural="serviceaccounts", kind="ServiceAccount", namespaced=True
)
#: The schedulers' client limits in every run (see the module's docstring).
CLIENT_QPS = 1_000
#: A run whose pods are not all bound by then fails, naming what is left.
BOUND_WITHIN = 600.0
#: Issue 17: kube-scheduler's pods/s with the extender at least half its pods/s without.
GOAL_RATIO = 0.5
#: Rounds of the four runs (one with ``--quick``).
ROUNDS = 3
#: Writes in flight while nodes and pods are created.
IN_FLIGHT = 16


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    """What a run measured in each round: pods/s, and the binds the extender refused (0
    without it)."""

    rates: tuple[float, ...]
    refused: int = 0

    @property
    def rate(self) -> float:
        """The median of the rounds' pods/s."""
        return statistics.median(self.rates)


class Run(msgspec.Struct, frozen=True, kw_only=True):
    """One run: its name, the scheduler profile its pods name, the configuration's source
    (the component's file) and whether the extender is kept in it."""

    name: str
    profile: str
    source: Path
    #: "" (none), :data:`OURS` or :data:`NOOP`.
    extender: str = ""
    #: ``nodeCacheCapable`` set so in the configuration (None: as the component has it).
    node_cache: bool | None = None

    @property
    def shipped(self) -> bool:
        """Whether the run's configuration is the component's own."""
        return self.node_cache is None


OURS = "neuron-dra"
NOOP = "no-op"
ALONE = Run(
    name="kube-scheduler alone",
    profile="default-scheduler",
    source=COMPONENT / "default-scheduler" / "kube-scheduler-config.yaml",
)
WITH_EXTENDER = (
    Run(
        name="node names",
        profile="my-scheduler",
        source=COMPONENT / "my-scheduler-config.yaml",
        extender=OURS,
    ),
    Run(
        name="default scheduler",
        profile="default-scheduler",
        source=COMPONENT / "default-scheduler" / "kube-scheduler-config.yaml",
        extender=OURS,
    ),
    Run(
        name="full Nodes",
        profile="default-scheduler",
        source=COMPONENT / "default-scheduler" / "kube-scheduler-config.yaml",
        extender=OURS,
        node_cache=False,
    ),
)


NOOP_RUN = Run(
    name="no-op extender",
    profile="my-scheduler",
    source=COMPONENT / "my-scheduler-config.yaml",
    extender=NOOP,
)
RUNS = (ALONE, NOOP_RUN, *WITH_EXTENDER)


def node_object(name: str, instance_type: str) -> Obj:
    """A Node as AWS's device plugin leaves it: Neuron devices and cores in its capacity and
    the instance type in its labels (what the extender reads)."""
    spec = instance_spec(instance_type)
    capacity = {
        "cpu": "192",
        "memory": "2Ti",
        "pods": "110",
        "aws.amazon.com/neuron": str(spec.devices),
        "aws.amazon.com/neuroncore": str(spec.devices * logical_cores_per_device(spec)),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "node.kubernetes.io/instance-type": instance_type,
            },
        },
        "status": {"capacity": capacity, "allocatable": capacity},
    }


def pod_object(name: str, *, resource: str, count: int, scheduler: str) -> Obj:
    """A pod written for AWS's device plugin: ``count`` of ``resource`` in its limits."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "schedulerName": scheduler,
            "restartPolicy": "Never",
            # Nodes without a kubelet are never Ready; nothing here runs anyway.
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": "main",
                    "image": "public.ecr.aws/neuron/pytorch-inference-neuronx",
                    "resources": {"limits": {resource: str(count)}},
                }
            ],
        },
    }


def scheduler_config(
    source: Obj,
    *,
    extender_url: str | None,
    kubeconfig: Path,
    node_cache: bool | None = None,
    tls: realdeviceplugin.ExtenderTls | None = None,
) -> Obj:
    """The component's KubeSchedulerConfiguration ``source`` for this control plane: its
    extenders pointed at ``extender_url`` (or removed when None; ``nodeCacheCapable`` set to
    ``node_cache`` unless None; with ``tls``, its client certificate, else plain HTTP), no
    leader election, the client limits of :data:`CLIENT_QPS`."""
    if extender_url is None:
        config = copy.deepcopy(source)
        config.pop("extenders", None)
    else:
        config = realdeviceplugin.scheduler_config(
            source, extender_url=extender_url, node_cache=node_cache, tls=tls
        )
        if tls is None:  # the baseline extender speaks plain HTTP
            for entry in config["extenders"]:
                entry.pop("tlsConfig", None)
                entry["enableHTTPS"] = False
    config["clientConnection"] = {
        "kubeconfig": str(kubeconfig),
        "qps": CLIENT_QPS,
        "burst": CLIENT_QPS,
    }
    config["leaderElection"] = {"leaderElect": False}
    return config


class Binds:
    """When each pod was first seen bound, from watch events in the order they arrive.

    >>> binds = Binds(["a"])
    >>> binds.saw({"type": "MODIFIED", "object": {"metadata": {"name": "a"},
    ...            "spec": {"nodeName": "n"}}}, at=2.0)
    True
    >>> binds.at
    {'a': 2.0}
    """

    def __init__(self, names: Iterable[str]) -> None:
        self.waiting = set(names)
        self.at: dict[str, float] = {}
        #: The last scheduling message of each pod not bound yet, to say why in a failure.
        self.why: dict[str, str] = {}

    def saw(self, event: Obj, *, at: float) -> bool:
        """Take one watch event that arrived at ``at``; True once every pod is bound."""
        obj = event.get("object") or {}
        name = str((obj.get("metadata") or {}).get("name") or "")
        if event.get("type") in ("ADDED", "MODIFIED") and name in self.waiting:
            if (obj.get("spec") or {}).get("nodeName"):
                self.waiting.discard(name)
                self.at[name] = at
                self.why.pop(name, None)
            else:
                for condition in (obj.get("status") or {}).get("conditions") or []:
                    if condition.get("type") == "PodScheduled" and condition.get("message"):
                        self.why[name] = str(condition["message"])
        return not self.waiting

    def unbound(self) -> str:
        """What is left, for a failure: how many and a reason the scheduler gave."""
        reasons = sorted({why for name, why in self.why.items() if name in self.waiting})
        said = f"; the scheduler says: {reasons[0]}" if reasons else ""
        return f"{len(self.waiting)} of {len(self.waiting) + len(self.at)} pods not bound{said}"


def refused_binds(metrics: str) -> int:
    """How many binds the extender answered with an error, from its ``/metrics`` text: each
    one sends the pod back to the scheduler's queue, to be tried again after a back-off.

    >>> refused_binds('neuron_dra_extender_decisions_total{verb="bind",outcome="error"} 3.0')
    3
    """
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if (
                sample.name == "neuron_dra_extender_decisions_total"
                and sample.labels.get("verb") == "bind"
                and sample.labels.get("outcome") == "error"
            ):
                return int(sample.value)
    return 0


def drain_rate(times: Iterable[float]) -> float:
    """Pods/s from the times the pods were bound: the pods after the first over the time from
    the first bind to the last.

    >>> drain_rate([10.0, 10.5, 11.0])
    2.0
    """
    ordered = sorted(times)
    if len(ordered) < 2 or ordered[-1] <= ordered[0]:
        raise ValueError(f"pods/s needs binds at two different times, got {ordered}")
    return (len(ordered) - 1) / (ordered[-1] - ordered[0])


async def _each(items: Iterable[Obj], *, post: Any) -> None:
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def one(item: Obj) -> None:
        async with gate:
            await post(item)

    await asyncio.gather(*(one(i) for i in items))


async def _populate(kube: KubeClient, fleet: list[tuple[str, str]]) -> None:
    await kube.create(NAMESPACES, {"metadata": {"name": NAMESPACE}})
    # No controller-manager makes it; the ServiceAccount admission wants it.
    await kube.create(SERVICE_ACCOUNTS, {"metadata": {"name": "default", "namespace": NAMESPACE}})

    async def post(node: Obj) -> None:
        await kube.create(NODES, node, metadata_only=True)

    await _each((node_object(n, t) for n, t in fleet), post=post)


async def _watch_binds(kube: KubeClient, binds: Binds, listed: asyncio.Event) -> None:
    items, version = await kube.list(PODS, namespace=NAMESPACE)
    done = False
    for obj in items:
        done = binds.saw({"type": "ADDED", "object": obj}, at=time.perf_counter())
    listed.set()
    while not done:
        async for event in kube.watch(PODS, resource_version=version, namespace=NAMESPACE):
            at = time.perf_counter()
            if event.get("type") == "ERROR":
                raise RuntimeError(f"the watch of pods in {NAMESPACE} ended: {event}")
            obj = event.get("object") or {}
            version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
            if binds.saw(event, at=at):
                done = True
                break


def _scheduler(plane: ControlPlane, run: Run, *, extender_url: str | None) -> components.Component:
    kubeconfig = plane.kubeconfig("kube-scheduler", user="system:kube-scheduler")
    source = yaml.safe_load(run.source.read_text())
    config = plane.root / f"{run.name.replace(' ', '-')}.yaml"
    config.write_text(
        yaml.safe_dump(
            scheduler_config(
                source,
                extender_url=extender_url,
                kubeconfig=kubeconfig,
                node_cache=run.node_cache,
                # Ours speaks HTTPS with client certificates only, as deployed.
                tls=_extender_tls(plane) if run.extender == OURS else None,
            )
        )
    )
    return components.scheduler(
        binary=plane.binaries.kube_scheduler,
        kubeconfig=kubeconfig,
        port=process.free_port(),
        config=config,
        name=f"kube-scheduler ({run.name})",
    )


def _extender_tls(plane: ControlPlane) -> realdeviceplugin.ExtenderTls:
    return realdeviceplugin.extender_tls(plane.root / "extender-pki")


def _extender(plane: ControlPlane) -> tuple[components.Component, str]:
    ext = realdeviceplugin.extender(kubeconfig=plane.admin, tls=_extender_tls(plane))
    ext.env["NEURON_DRA_LOG_LEVEL"] = "warning"
    # The full-Nodes run sends every Node whole (a few KiB each): more than the default
    # limit, sized for node names, on a large fleet.
    ext.env["NEURON_DRA_MAX_ARGS_BYTES"] = str(256 * 2**20)
    return ext, f"https://127.0.0.1:{ext.ports['verbs']}"


def _noop_extender(plane: ControlPlane) -> tuple[components.Component, str]:
    port = process.free_port()
    ext = components.Component(
        name="no-op extender",
        kind="no-op-extender",
        argv=[sys.executable, "-m", "bench.noop_extender", f"--port={port}",
              f"--kubeconfig={plane.admin}"],
        ports={"http": port},
        ready=lambda: probes.http_ok(f"http://127.0.0.1:{port}/readyz"),
        env={"PYTHONPATH": str(REPO)},
    )  # fmt: skip
    return ext, f"http://127.0.0.1:{port}"


def _metrics(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
        text: str = resp.read().decode()
        return text


async def _run(
    plane: ControlPlane, kube: KubeClient, run: Run, *, script: list[tuple[str, int]]
) -> Outcome:
    """One round of one run. Leaves no pod and no process of its own behind."""
    started = []
    try:
        url = None
        if run.extender:
            ext, url = (_extender if run.extender == OURS else _noop_extender)(plane)
            started.append(await asyncio.to_thread(plane.start, ext))
        pods = [
            pod_object(f"p{i:05d}", resource=r, count=c, scheduler=run.profile)
            for i, (r, c) in enumerate(script)
        ]

        async def post(pod: Obj) -> None:
            await kube.create(PODS, pod, namespace=NAMESPACE, metadata_only=True)

        await _each(pods, post=post)
        binds = Binds(p["metadata"]["name"] for p in pods)
        listed = asyncio.Event()
        watching = asyncio.create_task(_watch_binds(kube, binds, listed), name="watch-binds")
        await listed.wait()
        scheduler = _scheduler(plane, run, extender_url=url)
        started.append(await asyncio.to_thread(plane.start, scheduler))
        try:
            await asyncio.wait_for(watching, BOUND_WITHIN)
        except TimeoutError:
            raise RuntimeError(
                f"{run.name}: {binds.unbound()} within {BOUND_WITHIN:.0f} s "
                f"(logs under {plane.root})"
            ) from None
        refused = 0
        if run.extender == OURS and url is not None:
            # Its metrics are on the plain probes port, not beside the verbs.
            probes_url = f"http://127.0.0.1:{ext.ports['http']}"
            refused = refused_binds(await asyncio.to_thread(_metrics, probes_url))
        return Outcome(rates=(drain_rate(binds.at.values()),), refused=refused)
    finally:
        for running in reversed(started):
            await asyncio.to_thread(plane.stop, running)
        # No kubelet confirms a deletion: without a grace period the pods go at once.
        await kube.delete_collection(PODS, namespace=NAMESPACE, grace_period=0)


def combine(rounds: Iterable[Outcome]) -> Outcome:
    """The rounds of one run as one outcome: every round's pods/s, the refused binds summed.

    >>> combine([Outcome(rates=(2.0,), refused=1), Outcome(rates=(4.0,))])
    Outcome(rates=(2.0, 4.0), refused=1)
    """
    rounds = list(rounds)
    return Outcome(
        rates=tuple(r for o in rounds for r in o.rates), refused=sum(o.refused for o in rounds)
    )


async def _measure(
    plane: ControlPlane,
    fleet: list[tuple[str, str]],
    script: list[tuple[str, int]],
    *,
    rounds: int,
) -> dict[str, Outcome]:
    kube = KubeClient(await load_kubeconfig(plane.admin))
    try:
        await _populate(kube, fleet)
        made: dict[str, list[Outcome]] = {run.name: [] for run in RUNS}
        for _ in range(rounds):
            for run in RUNS:
                made[run.name].append(await _run(plane, kube, run, script=script))
        return {name: combine(outcomes) for name, outcomes in made.items()}
    finally:
        await kube.close()


def measure(
    fleet: list[tuple[str, str]], script: list[tuple[str, int]], *, rounds: int = ROUNDS
) -> tuple[list[Figure], list[str]]:
    """Pods/s of each run on ``fleet`` with the pods of ``script`` (median of ``rounds``
    rounds), as figures against the scheduler alone and the no-op extender, and the notes
    that go with them."""
    with (
        tempfile.TemporaryDirectory(prefix="bench-scheduling-") as tmp,
        control_plane(Path(tmp)) as plane,
    ):
        outcomes = asyncio.run(_measure(plane, fleet, script, rounds=rounds))
    return report(outcomes, nodes=len(fleet), pods=len(script))


def report(
    outcomes: dict[str, Outcome], *, nodes: int, pods: int
) -> tuple[list[Figure], list[str]]:
    """The figures (each run with the extender against the scheduler alone, and the node
    names run against the no-op extender) and the notes: the sizes, every round's pods/s, the
    binds the extender refused, the goal and whether each run meets it."""
    alone = outcomes[ALONE.name].rate
    noop = outcomes[NOOP_RUN.name].rate
    sizes = f"{nodes:,} nodes, {pods:,} pods"

    def figure(name: str, run: Run, against: Run) -> Figure:
        return Figure(
            name=name,
            unit="1/s",
            value=outcomes[run.name].rate,
            baseline=outcomes[against.name].rate,
            baseline_name=against.name,
        )

    figures = [
        figure(f"scheduler pods/s with the extender, {run.name} ({sizes})", run, ALONE)
        for run in WITH_EXTENDER
    ]
    names = WITH_EXTENDER[0]
    figures.append(
        figure(
            f"scheduler pods/s with the extender, {names.name}, against a no-op extender",
            names,
            NOOP_RUN,
        )
    )
    each = "; ".join(
        f"{run.name} " + " / ".join(f"{r:.1f}" for r in outcomes[run.name].rates) for run in RUNS
    )
    refused = ", ".join(f"{outcomes[run.name].refused:,} ({run.name})" for run in WITH_EXTENDER)
    ratios = list(zip(WITH_EXTENDER, figures[: len(WITH_EXTENDER)], strict=True))
    verdicts = ", ".join(
        f"{f.ratio:.2f}x with {run.name}: {'met' if f.ratio >= GOAL_RATIO else 'NOT met'}"
        for run, f in ratios
        if run.shipped
    )
    unshipped = ", ".join(f"{f.ratio:.2f}x with {run.name}" for run, f in ratios if not run.shipped)
    rounds = len(outcomes[ALONE.name].rates)
    notes = [
        f"scheduler pods/s: {sizes}; no kubelet (bound = scheduled); pods created before the "
        "scheduler starts, rate from the first bind to the last; scheduler client qps "
        f"{CLIENT_QPS:,} in every run; median of {rounds} interleaved rounds",
        f"pods/s of each round: {each}",
        f"the no-op extender (keeps every node, scores none, only binds) reaches "
        f"{noop / alone:.2f}x the scheduler alone: the most an extender served the way "
        "ours is can reach through this scheduler here",
        f"binds the extender refused (the pod retried after a back-off): {refused}",
        f"goal: scheduler throughput with the extender >= {GOAL_RATIO}x without it, with "
        f"the component's configurations: {verdicts}",
    ]
    if unshipped:
        notes.append(
            f"with a configuration that sends whole Nodes (nodeCacheCapable: false, not the "
            f"component's): {unshipped}"
        )
    return figures, notes
