"""The churn, the faults, the checks and the convergence wait of one chaos run.

Every step is one thing a user or the world does to a running local stack, drawn from a
seeded random generator (the same seed and stack draw the same steps): a pod asking for 1, 4,
8 or 16 connected trn2 devices created or deleted; a ``NeuronUltraServerWorkload`` of 1, 2 or
4 nodes with a random failure strategy created or deleted with its pods (one per node, on the
ResourceClaimTemplate the operator generates, so that the plugin's UltraServer path prepares
them); one neuron-dra process killed
(SIGKILL or SIGTERM) and started again after up to two seconds, as Kubernetes restarts a
container; a device of any node failing (an uncorrectable SRAM, HBM or NeuronCore error, or a
repairable HBM error, as ``neuron-dra dev fault`` makes them) or a failed one repaired; and,
with ``servers``, NATS or the apiserver killed and started again.

After every step the invariants (``chaos.invariants``) are checked on what the apiserver
shows and on every node's kubelet plugin checkpoint and CDI specs (``chaos.observe``); a check
the apiserver cannot answer (it is being restarted) is counted as skipped. A server's return
must be followed by every component up within R2's bound, or the run fails. When the churn
time is over the faults stop, every failed device is repaired, and the run waits until the
stack converged: every component up, every node offering all its devices untainted, every
workload ``Allocated`` with its pods' claims allocated, every churned pod's claim allocated
unless no node has its devices free, every pod whose claim is allocated Running, and the
topology allocator's free UltraServers exactly the fleet's minus those the workloads hold.
Then,
when asked, fuzzed messages go to the stack's consumers (``chaos.fuzz``) and a node's kubelet
plugin is rolled once per prepare and unprepare step (``chaos.rollout``). Last, the audit file
must reconcile with the claims prepared (``chaos.invariants``). The outcome judges the
campaign's goals R1 to R4 on what the run did.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from neuron_dra_cli.errors import CliError
from neuron_dra_cli.fault_cmd import apply_fault
from neuron_dra_cli.restart_cmd import restart_component
from neuron_dra_cli.stack import busauth, kubectl, lifecycle, state
from neuron_dra_cli.stack.alerting import audit_file
from neuron_dra_common.bus import RpcError
from neuron_dra_common.driver import DRIVER_NAME
from neuron_dra_common.ultraserver import FAILURE_STRATEGIES, TOPOLOGY_SIZES
from neuron_dra_kubelet_plugin.faults import STEPS

from chaos.fuzz import FuzzResult, crashed, fuzz_stack
from chaos.invariants import (
    INSTANCE_TYPE_LABEL,
    allocator_mismatches,
    audit_mismatches,
    devices_held_twice,
    free_devices,
    leftover_taints,
    nodes_held_twice,
    offered_problems,
    running_claims,
    unallocated_claims,
)
from chaos.observe import ask_allocator, node_files_problems
from chaos.rollout import StepResult, get_pod, node_problems, roll

__all__ = ["Options", "Outcome", "run"]

Obj = dict[str, Any]
NAMESPACE = "chaos"
#: Where the operator keeps the NeuronUltraServers.
DRIVER_NAMESPACE = "neuron-dra-driver"
COUNTS = (1, 4, 8, 16)
#: The label naming the workload a churned workload pod belongs to.
WORKLOAD_LABEL = "chaos.neuron.aws.com/workload"
#: The neuron-dra processes a step may kill, by kind (the control plane is ``servers``).
SERVICE_KINDS = (
    "slice-publisher",
    "topology-allocator",
    "ultraserver-operator",
    "failure-detector",
    "audit",
    "alerts",
    "kubelet-plugin",
    "health-probe",
    "discovery",
)
SERVERS = ("nats", "kube-apiserver")
#: The device faults a step makes (the repairable one taints NoSchedule, the rest NoExecute).
DEVICE_FAULTS = ("sram", "hbm", "nc", "hbm-repairable")
#: Devices per node the faults choose from (every Trainium2 node has 16).
DEVICES = 16
#: Seconds the audit may take to show what happened once the stack converged.
AUDIT_PATIENCE = 60.0
#: The churn R1 is stated for, and R2's bound from a server's return to all up.
R1_SECONDS: Final = 30 * 60
R2_SECONDS: Final = 10.0
R3_INPUTS: Final = 10_000


@dataclass(frozen=True)
class Options:
    state_dir: Path
    seconds: float
    seed: int
    servers: bool = True
    #: A server (``nats`` or ``kube-apiserver``) restarted as the churn's first step.
    restart_first: str | None = None
    #: Most pods and workloads alive at once. Two workloads of at most one UltraServer each
    #: always fit the fleet's two, so every workload must end Allocated.
    max_pods: int = 6
    max_workloads: int = 2
    converge_within: float = 240.0
    #: Fuzzed messages sent to the stack's consumers once it converged (0: none).
    fuzz: int = 0
    #: Roll a node's kubelet plugin once per prepare and unprepare step, the new one dying.
    rollout: bool = False
    say: Callable[[str], None] = print


#: The campaign's goals this driver measures.
GOALS: Final = {
    "R1": "nothing held twice, lost or doubled through 30 minutes of churn",
    "R2": f"NATS or apiserver back -> all up within {R2_SECONDS:g} s",
    "R3": f"{R3_INPUTS:,} fuzzed inputs: 0 crashes, dead letters = malformed",
    "R4": "a plugin rollout whose new pod dies at any step converges",
}


@dataclass
class Outcome:
    seed: int
    seconds: float
    steps: Counter[str] = field(default_factory=Counter)
    checks: int = 0
    skipped_checks: int = 0
    #: Invariants broken (devices or nodes held twice), in words, with the step before.
    violations: list[str] = field(default_factory=list)
    #: A killed process that did not come back, a server that left the stack down.
    failures: list[str] = field(default_factory=list)
    #: Seconds from each server's return until the apiserver answered and every component
    #: was up again.
    server_returns: list[tuple[str, float]] = field(default_factory=list)
    #: R2 broken: each server return not followed by all up within R2's bound, in words.
    slow_returns: list[str] = field(default_factory=list)
    converged_seconds: float | None = None
    not_converged: list[str] = field(default_factory=list)
    #: How the audit differs from the claims prepared once converged (``chaos.invariants``).
    audit_mismatches: list[str] = field(default_factory=list)
    #: The fuzz phase (``--fuzz``), and the components that died during it.
    fuzz: FuzzResult | None = None
    fuzz_crashes: list[str] = field(default_factory=list)
    #: The rollout phase (``--rollout``): one result per step, and the bystander's problems.
    rollout: list[StepResult] = field(default_factory=list)
    rollout_problems: list[str] = field(default_factory=list)

    @property
    def rollout_ok(self) -> bool:
        return not self.rollout_problems and not any(r.problem for r in self.rollout)

    @property
    def r2_ok(self) -> bool:
        """No server's return was followed by all up later than R2's bound."""
        return all(s <= R2_SECONDS for _, s in self.server_returns)

    @property
    def fuzz_ok(self) -> bool:
        f = self.fuzz
        return f is None or (
            f.dead_lettered == f.expected and not f.duplicates and not self.fuzz_crashes
        )

    @property
    def ok(self) -> bool:
        return (
            not self.violations
            and not self.failures
            and not self.audit_mismatches
            and self.converged_seconds is not None
            and self.r2_ok
            and self.fuzz_ok
            and self.rollout_ok
        )

    def goals(self) -> dict[str, str]:
        """The goals R1 to R4 (:data:`GOALS`), judged on this run: ``met``, ``NOT MET``, or
        why the run does not tell (R1 is stated for 30 minutes of churn, R2 needs a server
        restart, R3 ``--fuzz``, R4 ``--rollout``)."""
        held = not self.violations and not self.audit_mismatches and not self.failures
        if not held or self.converged_seconds is None:
            r1 = "NOT MET"
        elif self.seconds < R1_SECONDS:
            minutes = f"{self.seconds / 60:.1f}".removesuffix(".0")
            r1 = f"met for {minutes} of the goal's {R1_SECONDS // 60} minutes"
        else:
            r1 = "met"
        if not self.server_returns:
            r2 = "not measured: no server was restarted"
        else:
            worst = max(s for _, s in self.server_returns)
            r2 = "met" if self.r2_ok else "NOT MET"
            r2 = f"{r2} (slowest {worst:.1f} s)"
        f = self.fuzz
        if f is None:
            r3 = "not measured: no --fuzz"
        elif not self.fuzz_ok:
            r3 = "NOT MET"
        elif f.sent < R3_INPUTS:
            r3 = f"met for {f.sent:,} of the goal's {R3_INPUTS:,} inputs"
        else:
            r3 = "met"
        if not self.rollout and not self.rollout_problems:
            r4 = "not measured: no --rollout"
        elif not self.rollout_ok:
            r4 = "NOT MET"
        else:
            done = {r.step for r in self.rollout}
            r4 = "met" if done == set(STEPS) else f"met for {len(done)} of {len(STEPS)} steps"
            r4 += f" (slowest {max(r.seconds for r in self.rollout):.1f} s)"
        return {"R1": r1, "R2": r2, "R3": r3, "R4": r4}

    def table(self) -> str:
        rows = [(name, str(n)) for name, n in sorted(self.steps.items())]
        rows += [
            ("invariant checks", f"{self.checks} ({self.skipped_checks} skipped: API away)"),
            ("devices or UltraServer nodes held twice", str(len(self.violations))),
            ("servers back, not all up within R2's bound", str(len(self.slow_returns))),
            ("processes or servers not back", str(len(self.failures))),
            *((f"{name} back -> all up", f"{s:.1f} s") for name, s in self.server_returns),
            (
                "faults stopped -> converged",
                f"{self.converged_seconds:.1f} s" if self.converged_seconds is not None else "NO",
            ),
            ("audit mismatches", str(len(self.audit_mismatches))),
            *self._fuzz_rows(),
            *(
                (
                    f"rollout, new plugin dies at {r.step}",
                    r.problem or f"converged {r.seconds:.1f} s",
                )
                for r in self.rollout
            ),
            *((f"goal {name}: {GOALS[name]}", verdict) for name, verdict in self.goals().items()),
        ]
        width = max(len(r[0]) for r in rows)
        lines = [f"== chaos (seed {self.seed}, {self.seconds:.0f} s of churn)"]
        lines += [f"{name.ljust(width)}  {value}" for name, value in rows]
        lines += [f"VIOLATION {v}" for v in self.violations]
        lines += [f"FAILURE {v}" for v in self.failures]
        lines += [f"R2 NOT MET {v}" for v in self.slow_returns]
        lines += [f"NOT CONVERGED {v}" for v in self.not_converged]
        lines += [f"AUDIT {v}" for v in self.audit_mismatches]
        lines += [
            f"FUZZ {v}" for v in (*self.fuzz_crashes, *(self.fuzz.missing if self.fuzz else ()))
        ]
        return "\n".join(lines)

    def _fuzz_rows(self) -> list[tuple[str, str]]:
        f = self.fuzz
        if f is None:
            return []
        return [
            ("fuzzed messages sent (all malformed)", f"{f.sent:,} to {len(f.consumers)} consumers"),
            ("their dead letters due / found", f"{f.expected:,} / {f.dead_lettered:,}"),
            ("dead letters doubled", str(f.duplicates)),
            ("processes died while fuzzed", str(len(self.fuzz_crashes))),
        ]

    def json_line(self) -> str:
        return json.dumps(
            {
                "name": "chaos",
                "seed": self.seed,
                "seconds": self.seconds,
                "steps": dict(sorted(self.steps.items())),
                "checks": self.checks,
                "skippedChecks": self.skipped_checks,
                "violations": self.violations,
                "failures": self.failures,
                "serverReturns": [{"server": n, "seconds": s} for n, s in self.server_returns],
                "slowReturns": self.slow_returns,
                "convergedSeconds": self.converged_seconds,
                "notConverged": self.not_converged,
                "auditMismatches": self.audit_mismatches,
                "fuzz": None
                if self.fuzz is None
                else {
                    "sent": self.fuzz.sent,
                    "expected": self.fuzz.expected,
                    "deadLettered": self.fuzz.dead_lettered,
                    "duplicates": self.fuzz.duplicates,
                    "missing": list(self.fuzz.missing),
                    "consumers": list(self.fuzz.consumers),
                    "crashes": self.fuzz_crashes,
                },
                "rollout": [r._asdict() for r in self.rollout],
                "rolloutProblems": self.rollout_problems,
                "goals": self.goals(),
                "ok": self.ok,
            },
            sort_keys=True,
        )


class Stack:
    """kubectl and the component table of the stack under ``state_dir``."""

    def __init__(self, state_dir: Path) -> None:
        current = state.load(state_dir)
        if current is None:
            raise CliError(
                f"no stack recorded under {state_dir}; start one with `neuron-dra dev up`"
            )
        self.state_dir = state_dir
        self.kubeconfig = Path(current.kubeconfig)
        self.nats_url = current.nats_url

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        return kubectl.run(self.kubeconfig, args, input=input, check=check).stdout

    def items(self, *args: str) -> list[Obj] | None:
        """The objects ``kubectl get ARGS`` lists, or None while the apiserver is away."""
        proc = kubectl.run(self.kubeconfig, ("get", *args, "-o", "json"), check=False)
        if proc.returncode != 0:
            return None
        items: list[Obj] = json.loads(proc.stdout).get("items", [])
        return items

    def components(self) -> list[state.ComponentState]:
        current = state.load(self.state_dir)
        return list(current.components) if current else []

    def down(self) -> list[str]:
        report = lifecycle.status(self.state_dir)
        return [] if report is None else [c.name for c in report[1] if not c.up]


def _template(count: int) -> Obj:
    """A claim template for ``count`` connected trn2 devices (the devices of one 1-, 4-, 8-
    or 16-device group, as AWS's Neuron DRA driver guide asks for them)."""
    request = {
        "name": "neurons",
        "exactly": {
            "deviceClassName": "neuron.aws.com",
            "allocationMode": "ExactCount",
            "count": count,
            "selectors": [
                {
                    "cel": {
                        "expression": "device.attributes['neuron.aws.com'].instanceType"
                        " == 'trn2.48xlarge'"
                    }
                }
            ],
        },
    }
    devices: Obj = {"requests": [request]}
    if count > 1:
        devices["constraints"] = [
            {"requests": ["neurons"], "matchAttribute": f"resource.aws.com/devicegroup{count}_id"}
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": f"chaos-{count}", "namespace": NAMESPACE},
        "spec": {"spec": {"devices": devices}},
    }


def _pod(name: str, count: int) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": "chaos"}},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "ctr",
                    "image": "public.ecr.aws/docker/library/alpine:latest",
                    "command": ["sleep", "infinity"],
                    "resources": {"claims": [{"name": "neurons"}]},
                }
            ],
            "resourceClaims": [{"name": "neurons", "resourceClaimTemplateName": f"chaos-{count}"}],
        },
    }


def _workload(name: str, *, size: int, strategy: str) -> Obj:
    return {
        "apiVersion": "neuron.aws.com/v1beta1",
        "kind": "NeuronUltraServerWorkload",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "instanceType": "trn2u.48xlarge",
            "topologySize": size,
            "serverCount": 1,
            "allocationPolicy": {"failureStrategy": strategy},
        },
    }


def _workload_pod(workload: str, index: int) -> Obj:
    """Pod ``index`` of ``workload``: one UltraServer node, through the ResourceClaimTemplate
    the operator generates for the workload (named after it), as AWS's operator guide runs a
    workload's pods."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{workload}-{index}",
            "namespace": NAMESPACE,
            "labels": {WORKLOAD_LABEL: workload},
        },
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "ctr",
                    "image": "public.ecr.aws/docker/library/alpine:latest",
                    "command": ["sleep", "infinity"],
                    "resources": {"claims": [{"name": "neuron-claim"}]},
                }
            ],
            "resourceClaims": [{"name": "neuron-claim", "resourceClaimTemplateName": workload}],
        },
    }


def _objects(*objs: Obj) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objs)})


class Driver:
    def __init__(self, options: Options) -> None:
        self.o = options
        self.rng = random.Random(options.seed)
        self.stack = Stack(options.state_dir)
        self.out = Outcome(seed=options.seed, seconds=options.seconds)
        self.serial = 0
        #: Every invariant problem seen so far (each is a violation once).
        self.seen: set[str] = set()
        #: (node, device) of every fault made and not yet repaired.
        self.faulted: set[tuple[str, int]] = set()

    # --- steps -------------------------------------------------------------------------
    def _names(self, kind: str, *args: str) -> list[str]:
        items = self.stack.items(kind, "-n", NAMESPACE, *args) or []
        return sorted(
            i["metadata"]["name"] for i in items if not i["metadata"].get("deletionTimestamp")
        )

    def step(self) -> str:
        choices: list[tuple[str, float]] = [
            ("pod created", 3),
            ("pod deleted", 2),
            ("workload created", 2),
            ("workload deleted", 1.5),
            ("service killed", 2),
            ("device failed", 1),
            ("device repaired", 1),
        ]
        if self.o.servers:
            choices.append(("server restarted", 0.4))
        name = self.rng.choices([c[0] for c in choices], weights=[c[1] for c in choices])[0]
        done: str | None = getattr(self, "_" + name.replace(" ", "_"))()
        if done:
            self.out.steps[done] += 1
        return done or name

    def _pod_created(self) -> str | None:
        if len(self._names("pods", "-l", "app=chaos")) >= self.o.max_pods:
            return self._pod_deleted()
        self.serial += 1
        count = self.rng.choice(COUNTS)
        proc = kubectl.run(
            self.stack.kubeconfig,
            ("apply", "-f", "-"),
            input=_objects(_pod(f"p{self.serial}-{count}", count)),
            check=False,
        )
        return f"pod of {count} created" if proc.returncode == 0 else None

    def _pod_deleted(self) -> str | None:
        pods = self._names("pods", "-l", "app=chaos")
        if not pods:
            return None
        victim = self.rng.choice(pods)
        self.stack.kubectl("delete", "pod", victim, "-n", NAMESPACE, "--wait=false", check=False)
        return "pod deleted"

    def _workload_created(self) -> str | None:
        if len(self._names("nusw")) >= self.o.max_workloads:
            return self._workload_deleted()
        self.serial += 1
        size = self.rng.choice(TOPOLOGY_SIZES)
        strategy = self.rng.choice(FAILURE_STRATEGIES)
        name = f"w{self.serial}-{size}"
        pods = [_workload_pod(name, i) for i in range(size)]
        proc = kubectl.run(
            self.stack.kubeconfig,
            ("apply", "-f", "-"),
            input=_objects(_workload(name, size=size, strategy=strategy), *pods),
            check=False,
        )
        return f"workload of {size} created" if proc.returncode == 0 else None

    def _workload_deleted(self) -> str | None:
        workloads = self._names("nusw")
        if not workloads:
            return None
        victim = self.rng.choice(workloads)
        self.stack.kubectl(
            "delete",
            "pods",
            "-n",
            NAMESPACE,
            "-l",
            f"{WORKLOAD_LABEL}={victim}",
            "--wait=false",
            check=False,
        )
        self.stack.kubectl("delete", "nusw", victim, "-n", NAMESPACE, "--wait=false", check=False)
        return "workload deleted"

    def _service_killed(self) -> str | None:
        candidates = sorted(c.name for c in self.stack.components() if c.kind in SERVICE_KINDS)
        if not candidates:
            return None
        victim = self.rng.choice(candidates)
        kill = self.rng.random() < 0.5
        down = round(self.rng.uniform(0, 2), 1)
        try:
            restart_component(self.o.state_dir, name=victim, kill=kill, down_seconds=down)
        except CliError as exc:
            self.out.failures.append(f"{victim} did not come back: {exc}")
            return None
        kind = next(c.kind for c in self.stack.components() if c.name == victim)
        return f"{kind} {'SIGKILL' if kill else 'SIGTERM'}"

    def _device_failed(self) -> str | None:
        nodes = sorted(n["metadata"]["name"] for n in self.stack.items("nodes") or ())
        if not nodes:
            return None
        node, device = self.rng.choice(nodes), self.rng.randrange(DEVICES)
        fault = self.rng.choice(DEVICE_FAULTS)
        try:
            apply_fault(self.o.state_dir, node=node, fault=fault, device=device)
        except CliError as exc:
            self.out.failures.append(f"fault {fault} on {node} device {device}: {exc}")
            return None
        self.faulted.add((node, device))
        return f"device failed ({fault})"

    def _device_repaired(self) -> str | None:
        if not self.faulted:
            return None
        node, device = self.rng.choice(sorted(self.faulted))
        self._repair(node, device)
        return "device repaired"

    def _repair(self, node: str, device: int) -> None:
        try:
            apply_fault(self.o.state_dir, node=node, fault="repair", device=device)
        except CliError as exc:
            self.out.failures.append(f"repair of {node} device {device}: {exc}")
        self.faulted.discard((node, device))

    def _server_restarted(self, server: str | None = None) -> str | None:
        server = server or self.rng.choice(SERVERS)
        done = restart_component(
            self.o.state_dir, name=server, kill=True, down_seconds=round(self.rng.uniform(1, 3), 1)
        )
        start = time.monotonic()
        deadline = start + 120
        late: list[str] | None = None  # what was still down at R2's bound
        while time.monotonic() < deadline:
            api = kubectl.run(self.stack.kubeconfig, ("get", "--raw", "/readyz"), check=False)
            down = self.stack.down() + ([] if api.returncode == 0 else ["kube-apiserver"])
            if not down:
                break
            if late is None and time.monotonic() - start > R2_SECONDS:
                late = down
            time.sleep(0.2)
        else:
            self.out.failures.append(
                f"{server} back, but not all up 120 s later: {self.stack.down()}"
            )
        took = time.monotonic() - start
        self.out.server_returns.append((server, took))
        if took > R2_SECONDS:
            self.out.slow_returns.append(
                f"{server} back -> all up took {took:.1f} s, over {R2_SECONDS:g} s; "
                f"still down at {R2_SECONDS:g} s: {', '.join(late or ['?'])}"
            )
        self.o.say(f"  {server} away {done.away_seconds:.1f} s")
        return f"{server} restarted"

    # --- checks ------------------------------------------------------------------------
    def check(self, when: str) -> None:
        claims = self.stack.items("resourceclaims", "-A")
        workloads = self.stack.items("nusw", "-A")
        if claims is None or workloads is None:
            self.out.skipped_checks += 1
            return
        self.out.checks += 1
        plugins = [c for c in self.stack.components() if c.kind == "kubelet-plugin"]
        problems = devices_held_twice(claims) + nodes_held_twice(workloads)
        for problem in problems + node_files_problems(plugins):
            if problem in self.seen:
                continue  # the same one still there: named once, after the step that showed it
            self.seen.add(problem)
            entry = f"{problem} (after {when})"
            self.out.violations.append(entry)
            self.o.say(f"  VIOLATION {entry}")

    def unconverged(self) -> list[str]:
        problems = [f"{name} down" for name in self.stack.down()]
        pods = self.stack.items("pods", "-n", NAMESPACE)
        claims = self.stack.items("resourceclaims", "-A")
        workloads = self.stack.items("nusw", "-A")
        nodes = self.stack.items("nodes")
        slices = self.stack.items(
            "resourceslices", "--field-selector", f"spec.driver={DRIVER_NAME}"
        )
        ultraservers = self.stack.items("nus", "-n", DRIVER_NAMESPACE)
        if (
            pods is None
            or claims is None
            or workloads is None
            or nodes is None
            or slices is None
            or ultraservers is None
        ):
            return [*problems, "the apiserver does not answer"]
        problems += offered_problems(nodes, slices)
        trn2 = [
            n
            for n in nodes
            if (n["metadata"].get("labels") or {}).get(INSTANCE_TYPE_LABEL) == "trn2.48xlarge"
        ]
        problems += unallocated_claims(
            pods,
            [c for c in claims if c["metadata"].get("namespace") == NAMESPACE],
            free_devices(trn2, slices, claims),
            counts={f"chaos-{n}": n for n in COUNTS},
        )
        problems += self.allocator_problems(ultraservers, workloads)
        allocated = {
            ref["name"]
            for c in claims
            if c["metadata"].get("namespace") == NAMESPACE
            and (c.get("status") or {}).get("allocation")
            for ref in c["metadata"].get("ownerReferences") or ()
        }
        for pod in pods:
            name = pod["metadata"]["name"]
            phase = (pod.get("status") or {}).get("phase")
            if pod["metadata"].get("deletionTimestamp"):
                problems.append(f"pod {name} still terminating")
            elif name in allocated and phase != "Running":
                problems.append(f"pod {name} allocated but {phase}")
        problems += leftover_taints(slices)
        for w in workloads:
            if w["metadata"].get("namespace") != NAMESPACE:
                continue
            st = (w.get("status") or {}).get("state")
            if w["metadata"].get("deletionTimestamp"):
                problems.append(f"workload {w['metadata']['name']} still being deleted")
            elif st != "Allocated":
                problems.append(f"workload {w['metadata']['name']} {st}")
        return problems

    def allocator_problems(self, ultraservers: list[Obj], workloads: list[Obj]) -> list[str]:
        """How the topology allocator's free UltraServers differ from the fleet minus those
        the workloads hold (``chaos.invariants.allocator_mismatches``)."""
        fleet = {
            u["metadata"]["name"]: [
                str(t.get("nodeName")) for t in (u.get("spec") or {}).get("topology") or ()
            ]
            for u in ultraservers
        }
        if not fleet:
            return []
        try:
            decided = ask_allocator(
                self.stack.nats_url, busauth.admin_credentials(self.o.state_dir), len(fleet)
            )
        except (RpcError, OSError) as exc:
            return [f"the topology allocator does not answer: {exc}"]
        return allocator_mismatches(
            fleet,
            workloads,
            granted=decided.granted,
            reason=decided.reason,
            refusals=[(r.ultraserver, r.code, r.holders) for r in decided.refusals],
        )

    def audit_problems(self) -> list[str]:
        """How the audit file differs from the claims of the pods running now."""
        pods = self.stack.items("pods", "-n", NAMESPACE)
        claims = self.stack.items("resourceclaims", "-n", NAMESPACE)
        if pods is None or claims is None:
            return ["the apiserver does not answer"]
        running = running_claims(pods, claims)
        return audit_mismatches(_audit_lines(self.o.state_dir), running, namespace=NAMESPACE)

    # --- the run -----------------------------------------------------------------------
    def run(self) -> Outcome:
        self.stack.kubectl("create", "namespace", NAMESPACE, check=False)
        self.stack.kubectl("apply", "-f", "-", input=_objects(*(_template(n) for n in COUNTS)))
        deadline = time.monotonic() + self.o.seconds
        if self.o.restart_first:
            done = self._server_restarted(self.o.restart_first)
            if done:
                self.out.steps[done] += 1
            self.check(done or "a server restart")
        while time.monotonic() < deadline:
            self.check(self.step())
            time.sleep(self.rng.uniform(0.5, 3.0))
        self.o.say("churn over: repairing the failed devices, waiting for the stack to converge")
        stopped = time.monotonic()
        for node, device in sorted(self.faulted):
            self._repair(node, device)
        problems = self.unconverged()
        while problems and time.monotonic() - stopped < self.o.converge_within:
            time.sleep(1.0)
            self.check("the churn")
            problems = self.unconverged()
        if problems:
            self.out.not_converged = problems
        else:
            self.out.converged_seconds = time.monotonic() - stopped
        self.check("convergence")
        if self.o.fuzz > 0:
            self.fuzz()
        if self.o.rollout:
            self.rollout()
        # Last, so that it covers the rollout's claims too. The audit trails the stack by up
        # to the audit consumer's ack wait (30 s) when its process was killed with events in
        # flight.
        deadline = time.monotonic() + AUDIT_PATIENCE
        self.out.audit_mismatches = self.audit_problems()
        while self.out.audit_mismatches and time.monotonic() < deadline:
            time.sleep(1.0)
            self.out.audit_mismatches = self.audit_problems()
        return self.out

    def rollout(self) -> None:
        """R4: a rolling update of one trn2 node's plugin per step, the new plugin dying there.

        The churn's pods are deleted first, so the node has room; a bystander pod prepared by
        the old plugin before any rollout must keep its claim through all of them.
        """
        nodes = [
            n["metadata"]["name"]
            for n in self.stack.items("nodes") or ()
            if n["metadata"].get("labels", {}).get(INSTANCE_TYPE_LABEL) == "trn2.48xlarge"
        ]
        plugins = {
            c.env.get("NEURON_DRA_NODE_NAME"): c
            for c in self.stack.components()
            if c.kind == "kubelet-plugin"
        }
        candidates = sorted(n for n in nodes if n in plugins)
        if not candidates:
            self.out.rollout_problems.append("no trn2.48xlarge node with a kubelet plugin")
            return
        node = self.rng.choice(candidates)
        self.o.say(f"rollout: {len(STEPS)} rolling updates of {node}'s kubelet plugin")
        self.stack.kubectl(
            "delete", "pods", "-n", NAMESPACE, "-l", "app=chaos", "--timeout=180s", check=False
        )
        bystander = _pod("rollout-bystander", 4)
        bystander["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
        self.stack.kubectl("apply", "-f", "-", input=json.dumps(bystander))
        self.stack.kubectl(
            "wait",
            "pod/rollout-bystander",
            "-n",
            NAMESPACE,
            "--for=jsonpath={.status.phase}=Running",
            "--timeout=180s",
        )
        for serial, step in enumerate(STEPS):
            result = roll(
                self.stack,
                state_dir=self.o.state_dir,
                plugin=plugins[node],
                step=step,
                pod=_pod(f"rollout-{serial}", 1),
                namespace=NAMESPACE,
                serial=serial,
            )
            self.o.say(f"  {step}: {result.problem or f'converged in {result.seconds:.1f} s'}")
            self.out.rollout.append(result)
            self.check(f"the rollout at {step}")
        # The bystander still runs, prepared once, and the node holds nothing else.
        pod = get_pod(self.stack, NAMESPACE, "rollout-bystander")
        if pod is None or (pod.get("status") or {}).get("phase") != "Running":
            self.out.rollout_problems.append("the bystander pod is not Running")
        self.out.rollout_problems += node_problems(self.stack, NAMESPACE, node, plugins[node].env)

    def fuzz(self) -> None:
        """R3: fuzzed messages to every durable consumer of the converged stack."""
        self.o.say(f"fuzzing: {self.o.fuzz:,} malformed messages to the stack's consumers")
        before = {c.name: c.pid for c in self.stack.components()}
        self.out.fuzz = asyncio.run(
            fuzz_stack(
                self.stack.nats_url,
                count=self.o.fuzz,
                seed=self.o.seed,
                credentials=busauth.admin_credentials(self.o.state_dir),
            )
        )
        after = [(c.name, c.pid) for c in self.stack.components()]
        self.out.fuzz_crashes = crashed(before, after, self.stack.down())


def _audit_lines(state_dir: Path) -> list[Obj]:
    """The audit's CloudEvents, oldest first (rotated files before the current one)."""
    current = audit_file(state_dir)
    files = sorted(
        current.parent.glob(current.name + ".*"),
        key=lambda f: -int(f.suffix[1:]) if f.suffix[1:].isdigit() else 0,
    )
    lines: list[Obj] = []
    for path in [*files, current]:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            try:
                lines.append(json.loads(line))
            except ValueError:
                continue  # the line the audit is writing right now; read again later
    return lines


def run(options: Options) -> Outcome:
    """One chaos run against the stack under ``options.state_dir``."""
    return Driver(options).run()
