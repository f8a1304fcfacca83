"""A bounded chaos run, as a user runs it: ``python -m chaos`` against a stack of its fleet,
with pods and UltraServer workloads churned while neuron-dra processes, NATS and the
apiserver are killed and devices fail; nothing may be held twice, and everything converges
afterwards, every failed device repaired and untainted. Then malformed messages go to the
stack's consumers: each is one dead letter of each consumer that reads it, and nothing dies.
Last, a node's kubelet plugin is rolled once per prepare and unprepare step, the new plugin
dying at that step: the old one finishes each time.

Then each check is shown to fail when the thing it checks is broken on purpose, in short runs
on the same stack (each about a minute): a node's pool deleted and another's last device
dropped, their publisher stopped; an UltraServer taken in the allocator's view for a workload
that does not exist; a device written twice into a node's checkpoint; and a component kept down
past R2's bound after NATS returns. Each run exits 1 and names what broke; each test puts the
stack back afterwards."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from neuron_dra_cli.restart_cmd import restart_component
from neuron_dra_cli.stack import busauth, kubectl, process, state
from neuron_dra_common.bus import ALLOCATOR_SUBJECT, Bus, request
from neuron_dra_common.events import (
    AllocationDecided,
    AllocationReleased,
    AllocationRequested,
    ObjectRef,
)
from neuron_dra_kubelet_plugin.checkpoint import (
    CheckpointStore,
    ClaimEntry,
    ClaimState,
    PreparedDevice,
    read_boot_id,
)
from neuron_dra_kubelet_plugin.faults import STEPS

from chaos.invariants import offered_problems
from chaos.observe import checkpoint_path
from tests.fixtures.stack import REPO, KubeStack, start_stack, stop_stack

pytestmark = pytest.mark.stack

FLEET = REPO / "tests" / "fleets" / "chaos.yaml"
SEED = 20261126
FUZZ = 300


@pytest.fixture(scope="module")
def chaos_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeStack]:
    state_dir = tmp_path_factory.mktemp("chaos-stack")
    stack = start_stack(state_dir, fleet=FLEET)
    try:
        yield stack
    finally:
        stop_stack(state_dir)


def chaos(stack: KubeStack, *args: str) -> tuple[int, dict[str, Any], str]:
    """``python -m chaos ARGS`` against ``stack``: exit status, JSON line, all it printed."""
    proc = subprocess.run(
        [sys.executable, "-m", "chaos", *args, "--state-dir", str(stack.state_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    print(proc.stdout, proc.stderr)
    return proc.returncode, json.loads(proc.stdout.strip().splitlines()[-1]), proc.stdout


#: A short run for the broken-on-purpose tests: a few steps, no server restarts, and a
#: bounded wait for the convergence the break prevents.
SHORT = ("--minutes", "0.2", "--seed", str(SEED), "--no-servers", "--converge-seconds", "30")


def component(stack: KubeStack, name: str) -> state.ComponentState:
    current = state.load(stack.state_dir)
    assert current is not None
    return next(c for c in current.components if c.name == name)


def settle(stack: KubeStack) -> None:
    """Delete the churn's pods and workloads, so the next run starts from a quiet stack."""
    kubectl.run(
        stack.kubeconfig,
        ("delete", "pods,nusw", "--all", "-n", "chaos", "--timeout=180s"),
        check=False,
    )


def test_two_minutes_of_churn_and_kills_hold_nothing_twice_and_converge(
    chaos_stack: KubeStack,
) -> None:
    code, result, out = chaos(
        chaos_stack,
        *("--minutes", "2", "--seed", str(SEED), "--fuzz", str(FUZZ), "--rollout"),
    )
    assert code == 0, out
    assert result["ok"] is True
    assert result["seed"] == SEED
    assert result["violations"] == []
    assert result["failures"] == []
    assert result["notConverged"] == []
    assert result["slowReturns"] == []
    assert result["auditMismatches"] == []
    assert result["checks"] > 10
    assert result["convergedSeconds"] is not None
    assert result["goals"]["R1"] == "met for 2 of the goal's 30 minutes"
    fuzz = result["fuzz"]
    assert fuzz["sent"] == FUZZ
    # The stack's durable consumers of inventories, heartbeats, health and alerts all got some.
    assert {"slice-publisher-inventory", "health-monitor-heartbeats", "alert"} <= set(
        fuzz["consumers"]
    )
    assert fuzz["expected"] >= FUZZ
    assert fuzz["deadLettered"] == fuzz["expected"], fuzz["missing"]
    assert fuzz["duplicates"] == 0
    assert fuzz["crashes"] == []
    assert result["goals"]["R3"] == f"met for {FUZZ} of the goal's 10,000 inputs"
    assert [r["step"] for r in result["rollout"]] == list(STEPS)
    assert [r["problem"] for r in result["rollout"]] == [""] * len(STEPS)
    assert result["rolloutProblems"] == []
    assert result["goals"]["R4"].startswith("met (slowest ")
    steps = result["steps"]
    assert any("SIGKILL" in s or "SIGTERM" in s for s in steps), steps
    assert any(s.startswith("pod of") for s in steps), steps
    assert any(s.startswith("workload of") for s in steps), steps
    assert any(s.startswith("device failed") for s in steps), steps


def pools_back(stack: KubeStack, within: float = 60.0) -> None:
    """Wait until every node offers all its devices again."""
    deadline = time.monotonic() + within
    problems = ["not asked yet"]
    while problems and time.monotonic() < deadline:
        nodes = kubectl.run(stack.kubeconfig, ("get", "nodes", "-o", "json"))
        slices = kubectl.run(stack.kubeconfig, ("get", "resourceslices", "-o", "json"))
        problems = offered_problems(
            json.loads(nodes.stdout)["items"], json.loads(slices.stdout)["items"]
        )
        time.sleep(1.0)
    assert not problems, problems


def test_a_node_whose_pool_or_device_is_gone_fails_the_run_naming_it(
    chaos_stack: KubeStack,
) -> None:
    node, short = "trn2-48xl-1", "trn2-48xl-0"
    publisher = component(chaos_stack, "slice-publisher")
    process.kill_group(process.Running(pid=publisher.pid, start_ticks=publisher.start_ticks))
    kubectl.run(
        chaos_stack.kubeconfig,
        ("delete", "resourceslices", "--field-selector", f"spec.nodeName={node}"),
    )
    # The other node's slice loses its last device, as a publisher dropping it would.
    listed = kubectl.run(
        chaos_stack.kubeconfig,
        ("get", "resourceslices", "--field-selector", f"spec.nodeName={short}", "-o", "json"),
    )
    [piece] = json.loads(listed.stdout)["items"]
    assert piece["spec"]["devices"][-1]["name"] == "neurondevice15"
    piece["spec"]["devices"].pop()
    kubectl.run(chaos_stack.kubeconfig, ("replace", "-f", "-"), input=json.dumps(piece))
    try:
        code, result, out = chaos(chaos_stack, *SHORT)
    finally:
        restart_component(chaos_stack.state_dir, name="slice-publisher")
        # The publisher writes again a pool whose slices are gone (not one edited under it).
        kubectl.run(
            chaos_stack.kubeconfig,
            ("delete", "resourceslices", "--field-selector", f"spec.nodeName={short}"),
        )
        pools_back(chaos_stack)
        settle(chaos_stack)
    assert code == 1, out
    assert result["goals"]["R1"] == "NOT MET"
    assert (
        f"node {node} offers no ResourceSlice pool (16 devices expected)"
        in (result["notConverged"])
    )
    assert f"node {short} does not offer device neurondevice15" in result["notConverged"]
    assert f"NOT CONVERGED node {node} offers no ResourceSlice pool" in out


async def _allocator(stack: KubeStack, event: AllocationRequested | AllocationReleased) -> Any:
    bus = await Bus.connect(
        [stack.nats_url], name="chaos-test", credentials=busauth.admin_credentials(stack.state_dir)
    )
    try:
        return await request(bus, ALLOCATOR_SUBJECT, event, wait=10.0)
    finally:
        await bus.close()


def test_an_ultraserver_the_allocator_leaked_fails_the_run_naming_it(
    chaos_stack: KubeStack,
) -> None:
    # The allocator grants a whole UltraServer to a workload that exists nowhere else.
    ghost = ObjectRef(namespace="ghosts", name="ghost", uid=f"ghost-{uuid.uuid4()}")
    decided = asyncio.run(
        _allocator(
            chaos_stack,
            AllocationRequested(
                request_id=str(uuid.uuid4()), workload=ghost, topology_size=4, server_count=1
            ),
        )
    )
    assert isinstance(decided, AllocationDecided)
    assert decided.granted, decided.reason
    [leaked] = decided.ultraservers
    try:
        code, result, out = chaos(chaos_stack, *SHORT)
    finally:
        released = AllocationReleased(request_id=str(uuid.uuid4()), workload=ghost)
        asyncio.run(_allocator(chaos_stack, released))
        settle(chaos_stack)
    assert code == 1, out
    assert result["goals"]["R1"] == "NOT MET"
    assert (
        f"allocator holds nodes of {leaked} for ghosts/ghost, which no "
        "NeuronUltraServerWorkload records there"
    ) in result["notConverged"]


def test_a_device_twice_in_a_node_checkpoint_fails_the_run_naming_it(
    chaos_stack: KubeStack,
) -> None:
    node = "us1-trn2u-48xl-3"
    store = CheckpointStore(checkpoint_path(component(chaos_stack, f"kubelet-plugin-{node}")))
    doubled = store.load()
    for uid in ("double-a", "double-b"):
        doubled = doubled.with_entry(
            ClaimEntry(
                uid=uid,
                namespace="chaos",
                name=uid,
                state=ClaimState.PREPARE_COMPLETED,
                boot_id=read_boot_id(),
                devices=(
                    PreparedDevice(request_names=("neurons",), pool=node, device="neurondevice7"),
                ),
            )
        )
    store.save(doubled)
    store.close()
    try:
        code, result, out = chaos(chaos_stack, *SHORT)
    finally:
        store.save(store.load().without("double-a").without("double-b"))
        store.close()
        settle(chaos_stack)
    assert code == 1, out
    assert result["goals"]["R1"] == "NOT MET"
    problem = f"node {node}: checkpoint holds neurondevice7 in 2 claims (double-a, double-b)"
    assert any(v.startswith(problem) for v in result["violations"]), result["violations"]


def test_a_component_down_past_r2s_bound_after_nats_returns_fails_the_run(
    chaos_stack: KubeStack,
) -> None:
    # The audit goes down with NATS and comes back 25 s later: all up well after 10 s.
    late = threading.Thread(
        target=restart_component,
        args=(chaos_stack.state_dir,),
        kwargs={"name": "audit", "kill": True, "down_seconds": 25.0},
    )
    late.start()
    time.sleep(1.0)
    try:
        code, result, out = chaos(chaos_stack, *SHORT, "--restart-first", "nats")
    finally:
        late.join()
        settle(chaos_stack)
    assert code == 1, out
    assert result["goals"]["R2"].startswith("NOT MET (slowest ")
    [slow] = result["slowReturns"]
    assert slow.startswith("nats back -> all up took "), slow
    assert slow.endswith("still down at 10 s: audit"), slow
    assert f"R2 NOT MET {slow}" in out
