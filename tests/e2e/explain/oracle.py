"""What the real kube-scheduler decides for a scenario, node by node.

The scheduler's FailedScheduling message only counts nodes, and ``nodeName`` skips the
scheduler. So the pod to explain is created once unpinned, held back by a scheduling gate while
the cluster is read for explain (Pending, as a user sees it), then let go; then once per node
with ``nodeSelector: {kubernetes.io/hostname: N}``. Each copy has claims of its own from the
same templates, and pools are node-local, so the copies never compete.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Collection, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from neuron_dra_common.kube import NODES as NODE_OBJECTS
from neuron_dra_common.kube import PODS, RESOURCE_CLAIMS, RESOURCE_SLICES, Resource, connect

from tests.e2e.explain.scenarios import (
    BARE_LABEL,
    NODES,
    T0,
    Json,
    PoolBuilder,
    Scenario,
    trn2_copy,
)
from tests.fixtures.stack import KubeStack, neuron_dra

DEVICE_CLASSES = Resource(
    group="resource.k8s.io", version="v1", plural="deviceclasses", kind="DeviceClass"
)
TEMPLATES = Resource(
    group="resource.k8s.io",
    version="v1",
    plural="resourceclaimtemplates",
    kind="ResourceClaimTemplate",
    namespaced=True,
)
#: Everything explain reads about a pod, by the name Snapshot.build gives each list.
SNAPSHOT = {
    "pods": PODS,
    "nodes": NODE_OBJECTS,
    "slices": RESOURCE_SLICES,
    "claims": RESOURCE_CLAIMS,
    "classes": DEVICE_CLASSES,
    "templates": TEMPLATES,
}
SERVICE_ACCOUNTS = Resource(
    group="", version="v1", plural="serviceaccounts", kind="ServiceAccount", namespaced=True
)
R = TypeVar("R")
#: After every copy has an answer, it must stay the same this long: a copy refused because
#: the scheduler had not yet seen a new slice is retried (and bound) on that slice's event.
STABLE = 0.5
POLL = 0.2


@dataclass(frozen=True)
class Outcome:
    """One pod's answer from the scheduler: fits / does-not-fit / scheduler-error."""

    verdict: str
    node: str
    message: str


@dataclass(frozen=True)
class Observed:
    """The cluster as explain reads it while the unpinned pod is Pending (held back from the
    scheduler), the scheduler's answer for that pod once let go, and its answer for each
    pinned copy."""

    unpinned: Outcome
    snapshot: dict[str, list[Json]]
    pinned: dict[str, Outcome]
    #: ``neuron-dra explain pod/p -o json`` at the same moment, for the scenarios asked.
    cli: str | None = None


def outcome(pod: Json) -> Outcome | None:
    node = pod["spec"].get("nodeName", "")
    if node:
        return Outcome("fits", node, "")
    for cond in pod.get("status", {}).get("conditions", []):
        if cond["type"] == "PodScheduled" and cond["status"] == "False":
            verdict = {"Unschedulable": "does-not-fit", "SchedulerError": "scheduler-error"}
            if cond.get("reason") in verdict:
                return Outcome(verdict[cond["reason"]], "", cond.get("message", ""))
    return None


def pod(name: str, scenario: Scenario, *, pin: str = "") -> Json:
    claims: list[Json] = []
    if scenario.shared:
        claims.append({"name": "shared", "resourceClaimName": scenario.shared})
    claims += [
        {"name": f"c{i}", "resourceClaimTemplateName": f"c{i}"} for i in range(len(scenario.claims))
    ]
    selector = dict(scenario.node_selector)
    if pin:
        selector["kubernetes.io/hostname"] = pin
    spec: Json = {
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "main",
                "image": "busybox",
                "command": ["sleep", "infinity"],
                "resources": {"claims": [{"name": c["name"]} for c in claims]},
            }
        ],
        "resourceClaims": claims,
    }
    if selector:
        spec["nodeSelector"] = selector
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


class Reader:
    """The test's own reads of the cluster (polling pods and claims many times a second):
    one API client on a loop of its own, instead of a kubectl process per poll on a machine
    whose cores the stack needs."""

    def __init__(self, kubeconfig: str):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.kube = self.call(connect(kubeconfig=kubeconfig))

    def call(self, coro: Coroutine[Any, Any, R]) -> R:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=60)

    def items(
        self, resource: Resource, namespace: str | None = None, selector: str = ""
    ) -> list[Json]:
        items, _ = self.call(self.kube.list(resource, namespace=namespace, label_selector=selector))
        return items

    def snapshot(self) -> dict[str, list[Json]]:
        async def all_lists() -> list[tuple[list[Json], str]]:
            return await asyncio.gather(*(self.kube.list(r) for r in SNAPSHOT.values()))

        return {k: items for k, (items, _) in zip(SNAPSHOT, self.call(all_lists()), strict=True)}

    def close(self) -> None:
        self.call(self.kube.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


class Oracle:
    """Runs scenarios on one stack. Scenarios that need the same cluster-wide state and take
    at most one device per pod run at once (a wave), each in a namespace of its own; the
    rest one after another."""

    def __init__(self, stack: KubeStack, *, by_cli: Collection[str] = ()):
        self.stack = stack
        self.by_cli = set(by_cli)
        self.reader = Reader(str(stack.kubeconfig))
        slices = self.reader.items(RESOURCE_SLICES)
        #: The publisher's devices of a trn2.48xlarge, which the bare node's pools copy.
        self.trn2_devices: list[Json] = next(
            s["spec"]["devices"] for s in slices if s["spec"].get("nodeName") == T0
        )
        self._pool: PoolBuilder | None = None

    def close(self) -> None:
        """Leave the bare node without a pool, as the fleet has it."""
        self.stack.kubectl("delete", "resourceslices.resource.k8s.io", "-l", BARE_LABEL)
        self._pool = None
        self.reader.close()

    def apply(self, objs: list[Json], namespace: str = "") -> None:
        args = ["apply", "-f", "-"] + (["-n", namespace] if namespace else [])
        body = json.dumps({"apiVersion": "v1", "kind": "List", "items": objs})
        self.stack.kubectl(*args, input=body)

    def until(self, what: str, check: Callable[[], bool], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
            time.sleep(POLL)

    def pods(self, namespace: str, selector: str) -> dict[str, Json]:
        return {p["metadata"]["name"]: p for p in self.reader.items(PODS, namespace, selector)}

    def claims(self, namespace: str) -> list[Json]:
        return self.reader.items(RESOURCE_CLAIMS, namespace)

    def settle(self, namespace: str, selector: str, names: list[str]) -> dict[str, Outcome]:
        """Wait until every named pod has an answer that holds for ``STABLE`` seconds."""
        deadline = time.monotonic() + 90
        since: float | None = None
        last: dict[str, str] = {}
        while time.monotonic() < deadline:
            got = self.pods(namespace, selector)
            answers = {n: outcome(got[n]) for n in names if n in got}
            done = {n: o for n, o in answers.items() if o is not None}
            verdicts = {n: o.verdict for n, o in done.items()}
            if len(done) == len(names):
                if verdicts != last or since is None:
                    since, last = time.monotonic(), verdicts
                elif time.monotonic() - since >= STABLE:
                    return done
            else:
                since, last = None, verdicts
            time.sleep(POLL)
        raise AssertionError(f"pods {names} in {namespace} were not decided within 90 s: {last}")

    def namespaces(self, scenarios: list[tuple[Scenario, str]]) -> None:
        """Create every scenario's namespace at once, and wait for their ServiceAccounts
        (until the controller manager makes them, the apiserver refuses pods there)."""
        self.apply(
            [
                {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": ns, "labels": sc.namespace_labels},
                }
                for sc, ns in scenarios
            ]
        )
        names = {ns for _, ns in scenarios}

        def ready() -> bool:
            accounts = self.reader.call(
                self.reader.kube.list(SERVICE_ACCOUNTS, field_selector="metadata.name=default")
            )[0]
            return names <= {a["metadata"]["namespace"] for a in accounts}

        self.until("the default ServiceAccount of every scenario namespace", ready)

    def enter(self, scenario: Scenario) -> None:
        """Make the cluster-wide state of ``scenario``: the bare node's pool (unless it is
        the one in place), DeviceClasses, cordons, node taints."""
        stack = self.stack
        changed = bool(scenario.classes or scenario.cordon or scenario.node_taints)
        wanted = scenario.pool or trn2_copy
        if wanted is not self._pool:
            stack.kubectl("delete", "resourceslices.resource.k8s.io", "-l", BARE_LABEL)
            self.apply(wanted(self.trn2_devices))
            self._pool = wanted
            changed = True
        if scenario.classes:
            self.apply(list(scenario.classes))
        for node in scenario.cordon:
            stack.kubectl("cordon", node)
        for node, taint in scenario.node_taints:
            stack.kubectl("taint", "node", node, taint)
        if changed:
            # The scheduler learns of these by watch only: give its informers a moment (a pod
            # refused before they arrive would be retried on their event, which settle()
            # waits out too).
            time.sleep(0.5)

    def leave(self, scenario: Scenario) -> None:
        """Undo ``enter`` but for the pool, which the next scenario replaces if it must."""
        stack = self.stack
        for node in scenario.cordon:
            stack.kubectl("uncordon", node)
        for node, taint in scenario.node_taints:
            stack.kubectl("taint", "node", node, taint.split("=")[0] + "-")
        for cls in scenario.classes:
            stack.kubectl("delete", "deviceclass.resource.k8s.io", cls["metadata"]["name"])

    def hold(self, scenario: Scenario, namespace: str) -> None:
        """The scenario's templates, and its holders placed with their devices allocated."""
        objs: list[Json] = [
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": f"c{i}"},
                "spec": {"spec": spec},
            }
            for i, spec in enumerate(scenario.claims)
        ]
        for i, h in enumerate(scenario.holders):
            objs.append(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaim",
                    "metadata": {"name": f"hold-{i}"},
                    "spec": h.spec,
                }
            )
            holder = pod(f"hold-{i}", HOLDER, pin=h.node)
            holder["metadata"]["labels"] = {"role": "holder"}
            holder["spec"]["resourceClaims"] = [{"name": "h", "resourceClaimName": f"hold-{i}"}]
            holder["spec"]["containers"][0]["resources"] = {"claims": [{"name": "h"}]}
            objs.append(holder)
        if objs:
            self.apply(objs, namespace)
        if scenario.holders:
            names = [f"hold-{i}" for i in range(len(scenario.holders))]
            got = self.settle(namespace, "role=holder", names)
            bad = {n: o for n, o in got.items() if o.verdict != "fits"}
            assert not bad, f"{scenario.name}: holder pods were not placed: {bad}"

    def delete(self, namespace: str, selector: str) -> None:
        """Delete pods and wait until the claims made for them are gone."""
        self.stack.kubectl(
            "delete",
            "pods",
            "-n",
            namespace,
            "-l",
            selector,
            "--force",
            "--grace-period=0",
            "--wait=false",
        )

        def released() -> bool:
            return not [
                c
                for c in self.claims(namespace)
                if c["metadata"].get("annotations", {}).get(POD_CLAIM_NAME)
            ]

        self.until(f"the claims of {selector} in {namespace} to be gone", released)

    def clean(self, namespace: str) -> None:
        """Remove a scenario's pods and claims (waiting until their devices are free)."""
        stack = self.stack
        stack.kubectl(
            "delete",
            "pods",
            "--all",
            "-n",
            namespace,
            "--force",
            "--grace-period=0",
            "--wait=false",
        )
        stack.kubectl(
            "delete", "resourceclaims.resource.k8s.io", "--all", "-n", namespace, "--wait=false"
        )
        self.until(f"claims of {namespace} released", lambda: not self.claims(namespace))
        stack.kubectl("delete", "namespace", namespace, "--wait=false")

    def observe(self, scenario: Scenario, namespace: str) -> Observed:
        """Ask the scheduler about the unpinned pod and each pinned copy; clean up."""
        try:
            self.hold(scenario, namespace)
            unpinned = pod("p", scenario)
            unpinned["metadata"]["labels"] = {"role": "explained"}
            # Held back from the scheduler until explain has read the cluster: once bound,
            # the pod's claims are allocated and explain (rightly) sees them on that node.
            unpinned["spec"]["schedulingGates"] = [{"name": GATE}]
            self.apply([unpinned], namespace)
            self.until(
                f"the claims of {namespace}/p to be created",
                lambda: (
                    len(
                        self.pods(namespace, "role=explained")["p"]
                        .get("status", {})
                        .get("resourceClaimStatuses", [])
                    )
                    >= len(scenario.claims)
                ),
            )
            # What `neuron-dra explain pod/p` reads while p is Pending.
            snap = self.reader.snapshot()
            cli = None
            if scenario.name in self.by_cli:
                proc = neuron_dra(
                    "explain",
                    "pod/p",
                    "-n",
                    namespace,
                    "-o",
                    "json",
                    "--kubeconfig",
                    str(self.stack.kubeconfig),
                    timeout=120,
                )
                assert proc.returncode == 0, proc.stderr
                cli = proc.stdout
            self.stack.kubectl(
                "patch",
                "pod",
                "p",
                "-n",
                namespace,
                "--type=json",
                "-p",
                '[{"op": "remove", "path": "/spec/schedulingGates"}]',
            )
            first = self.settle(namespace, "role=explained", ["p"])["p"]
            self.delete(namespace, "role=explained")
            copies = []
            for node in NODES:
                c = pod(f"on-{node}", scenario, pin=node)
                c["metadata"]["labels"] = {"role": "copy"}
                copies.append(c)
            self.apply(copies, namespace)
            got = self.settle(namespace, "role=copy", [f"on-{n}" for n in NODES])
        finally:
            self.clean(namespace)
        pinned = {n: got[f"on-{n}"] for n in NODES}
        return Observed(unpinned=first, snapshot=snap, pinned=pinned, cli=cli)

    def run(self, scenarios: list[tuple[Scenario, str]]) -> dict[str, Observed]:
        """Every scenario (with its namespace), by name."""
        self.namespaces(scenarios)
        out: dict[str, Observed] = {}
        for wave in waves(scenarios):
            first = wave[0][0]
            self.enter(first)
            try:
                with ThreadPoolExecutor(max_workers=len(wave)) as pool:
                    futures = {sc.name: pool.submit(self.observe, sc, ns) for sc, ns in wave}
                    for name, future in futures.items():
                        out[name] = future.result()
            finally:
                self.leave(first)
        return out


def waves(scenarios: list[tuple[Scenario, str]]) -> list[list[tuple[Scenario, str]]]:
    """Consecutive light scenarios that need the same cluster-wide state go in one wave."""
    out: list[list[tuple[Scenario, str]]] = []
    for item in scenarios:
        sc = item[0]
        if out and sc.light and out[-1][0][0].light and out[-1][0][0].world == sc.world:
            out[-1].append(item)
        else:
            out.append([item])
    return out


#: The pod shape of a holder (its claim is put in by hand).
HOLDER = Scenario("holder", "", {})
POD_CLAIM_NAME = "resource.kubernetes.io/pod-claim-name"
GATE = "test.neuron.aws.com/explain-first"
