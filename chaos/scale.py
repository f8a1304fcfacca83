"""The chaos checks against a whole simulated fleet (``python -m bench scale --chaos``).

The fleet of the scale harness (``bench.fleetsim``) has no kubelets: its nodes run no pods, so
nothing prepares a claim and no node has a kubelet plugin checkpoint or CDI specs. What the
churn does there: NeuronUltraServerWorkloads of 4- and 2-node UltraServers created and
deleted, devices failed and repaired on the bus (as the health monitor reports them), and
the topology allocator, the UltraServer operator and the slice publisher killed with SIGKILL
and started again. What is checked (``chaos.invariants``, as the chaos driver checks it):

* after every step: no UltraServer node held by two workloads, no device held by two claims;
* once converged, on every node of the fleet: every node offers all its devices (its complete
  pool), none still tainted, every workload Allocated, and the allocator's free UltraServers
  equal the fleet minus those the workloads hold (asked over the bus, as the operator asks).

Not checked here, for want of kubelets: the checkpoints and CDI specs of each node, pods of
workloads, and the audit's prepared claims against running pods (the chaos driver checks those
on the local stack's 19 nodes).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from neuron_dra_common.bus import Bus, BusCredentials, RpcError
from neuron_dra_common.driver import DRIVER_NAME
from neuron_dra_common.events import DeviceHealthChanged
from neuron_dra_common.kube import NODES, RESOURCE_CLAIMS, RESOURCE_SLICES, KubeClient
from neuron_dra_common.ultraserver import NAMESPACE as US_NAMESPACE
from neuron_dra_ultraserver_operator.resources import NAMESPACES, NUS, NUSW

from chaos.invariants import (
    allocator_mismatches,
    devices_held_twice,
    leftover_taints,
    nodes_held_twice,
    offered_problems,
)
from chaos.observe import ask_allocator

__all__ = ["NAMESPACE", "ChaosOutcome", "ScaleChaos", "converge_problems"]

Obj = dict[str, Any]

NAMESPACE = "chaos-scale"
INSTANCE_TYPE = "trn2u.48xlarge"
#: Services killed (SIGKILL) and started again during the churn.
KILLED = ("topology-allocator", "ultraserver-operator", "slice-publisher")
CONVERGE_SECONDS = 240.0
SEED = 35


class Say(Protocol):
    def say(self, text: str) -> None: ...


@dataclass
class ChaosOutcome:
    nodes: int = 0
    steps: list[str] = field(default_factory=list)
    checks: int = 0
    violations: list[str] = field(default_factory=list)
    unconverged: list[str] = field(default_factory=list)
    converged_s: float | None = None

    def ok(self) -> bool:
        return not self.violations and not self.unconverged

    def lines(self) -> list[str]:
        kinds: dict[str, int] = {}
        for step in self.steps:
            kind = step.split(" ", 1)[0]
            kinds[kind] = kinds.get(kind, 0) + 1
        out = [
            f"chaos at {self.nodes:,} nodes: {'met' if self.ok() else 'NOT MET'}: "
            f"{len(self.steps)} steps ({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))})"
            f", {self.checks} checks, {len(self.violations)} violations; "
            + (
                f"converged {self.converged_s:.0f} s after the churn (every node offers all its "
                "devices, the allocator's free UltraServers are the fleet minus the held ones)"
                if self.converged_s is not None
                else "did NOT converge"
            )
        ]
        out += [f"  VIOLATION {v}" for v in self.violations[:10]]
        out += [f"  unconverged: {p}" for p in self.unconverged[:10]]
        return out

    def as_json(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes,
            "steps": len(self.steps),
            "checks": self.checks,
            "violations": self.violations,
            "unconverged": self.unconverged[:20],
            "converged_s": self.converged_s,
            "met": self.ok(),
        }


def converge_problems(
    *,
    nodes: list[Obj],
    slices: list[Obj],
    workloads: list[Obj],
) -> list[str]:
    """What keeps the fleet from having converged, apart from the allocator's view: pools
    missing or short of a device, taints left, workloads not Allocated."""
    problems = offered_problems(nodes, slices) + leftover_taints(slices)
    for w in workloads:
        state = (w.get("status") or {}).get("state")
        if w["metadata"].get("deletionTimestamp"):
            problems.append(f"workload {w['metadata']['name']} still being deleted")
        elif state != "Allocated":
            problems.append(f"workload {w['metadata']['name']} {state}")
    return problems


def _workload(name: str, size: int) -> Obj:
    return {
        "apiVersion": f"{NUSW.group}/{NUSW.version}",
        "kind": "NeuronUltraServerWorkload",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "instanceType": INSTANCE_TYPE,
            "topologySize": size,
            "serverCount": 1,
            "allocationPolicy": {"failureStrategy": "NoOp"},
            "resourceClaimTemplate": {"name": f"{name}-rct"},
        },
    }


class ScaleChaos:
    """The churn and the checks on a running scale fleet."""

    def __init__(
        self,
        *,
        kube: KubeClient,
        bus: Bus,
        nats_url: str,
        nodes: list[str],
        restart: Callable[[str], Awaitable[None]],
        progress: Say,
    ) -> None:
        self.kube = kube
        self.bus = bus
        self.nats_url = nats_url
        self.nodes = nodes
        self.restart = restart
        self.progress = progress
        self.rng = random.Random(SEED)
        self.out = ChaosOutcome(nodes=len(nodes))
        self.faulted: set[tuple[str, str]] = set()
        self._seen: set[str] = set()
        self._made = 0

    async def run(self, *, steps: int) -> ChaosOutcome:
        await self.kube.create(NAMESPACES, {"metadata": {"name": NAMESPACE}})
        for k in range(steps):
            step = await self._step(k)
            self.out.steps.append(step)
            await self._check(step)
            self.progress.say(f"chaos step {k + 1}/{steps}: {step}")
        for node, device in sorted(self.faulted):
            await self._health(node, device, healthy=True)
        self.faulted.clear()
        await self._converge()
        return self.out

    async def _step(self, k: int) -> str:
        workloads = await self._workload_names()
        if k % 10 == 5:
            name = KILLED[(k // 10) % len(KILLED)]
            await self.restart(name)
            return f"killed {name}, started again"
        roll = self.rng.random()
        if roll < 0.35 or not workloads:
            self._made += 1
            name, size = f"churn-{self._made:03d}", self.rng.choice((4, 2))
            await self.kube.create(NUSW, _workload(name, size), namespace=NAMESPACE)
            return f"created workload {name} (topologySize {size})"
        if roll < 0.55:
            name = self.rng.choice(workloads)
            await self.kube.delete(NUSW, name, namespace=NAMESPACE)
            return f"deleted workload {name}"
        if roll < 0.8 or not self.faulted:
            node = self.rng.choice(self.nodes)
            device = f"neurondevice{self.rng.randrange(16)}"
            await self._health(node, device, healthy=False)
            self.faulted.add((node, device))
            return f"failed {node}/{device}"
        node, device = sorted(self.faulted)[self.rng.randrange(len(self.faulted))]
        await self._health(node, device, healthy=True)
        self.faulted.discard((node, device))
        return f"repaired {node}/{device}"

    async def _workload_names(self) -> list[str]:
        items, _ = await self.kube.list(NUSW, namespace=NAMESPACE)
        return sorted(
            str(o["metadata"]["name"]) for o in items if not o["metadata"].get("deletionTimestamp")
        )

    async def _health(self, node: str, device: str, *, healthy: bool) -> None:
        """The device's health as the node's health monitor reports it."""
        now = datetime.now(UTC)
        event = (
            DeviceHealthChanged(
                node=node, device=device, health="Healthy", previous="Unhealthy", observed_at=now
            )
            if healthy
            else DeviceHealthChanged(
                node=node,
                device=device,
                health="Unhealthy",
                previous="Healthy",
                error_type="SRAM_UNCORRECTABLE_ERROR",
                severity="uncorrectable",
                evidence="chaos",
                action="reload-driver-or-reboot",
                observed_at=now,
            )
        )
        await self.bus.publisher(source="/chaos/scale").publish(event)

    async def _check(self, when: str) -> None:
        workloads, _ = await self.kube.list(NUSW)
        claims, _ = await self.kube.list(RESOURCE_CLAIMS)
        self.out.checks += 1
        for problem in devices_held_twice(claims) + nodes_held_twice(workloads):
            if problem not in self._seen:
                self._seen.add(problem)
                self.out.violations.append(f"{problem} (after {when})")

    async def _converge(self) -> None:
        t0 = time.monotonic()
        problems: list[str] = []
        while time.monotonic() - t0 < CONVERGE_SECONDS:
            nodes, _ = await self.kube.list(NODES)
            slices, _ = await self.kube.list(
                RESOURCE_SLICES, field_selector=f"spec.driver={DRIVER_NAME}"
            )
            workloads, _ = await self.kube.list(NUSW, namespace=NAMESPACE)
            problems = converge_problems(nodes=nodes, slices=slices, workloads=workloads)
            if not problems:
                problems = await self._allocator(workloads)
            if not problems:
                self.out.converged_s = round(time.monotonic() - t0, 1)
                self.out.unconverged = []
                return
            self.progress.say(f"chaos: converging, {len(problems)} problems: {problems[0]}")
            await asyncio.sleep(5.0)
        self.out.unconverged = problems

    async def _allocator(self, workloads: list[Obj]) -> list[str]:
        ultraservers, _ = await self.kube.list(NUS, namespace=US_NAMESPACE)
        fleet = {
            u["metadata"]["name"]: [
                str(t.get("nodeName")) for t in (u.get("spec") or {}).get("topology") or ()
            ]
            for u in ultraservers
        }
        # Every workload of the run holds nodes, the chaos ones and any other namespace's.
        everyone, _ = await self.kube.list(NUSW)
        try:
            decided = await asyncio.to_thread(
                ask_allocator, self.nats_url, BusCredentials(), len(fleet)
            )
        except (RpcError, OSError) as exc:
            return [f"the topology allocator does not answer: {exc}"]
        return allocator_mismatches(
            fleet,
            everyone,
            granted=decided.granted,
            reason=decided.reason,
            refusals=[(r.ultraserver, r.code, r.holders) for r in decided.refusals],
        )
