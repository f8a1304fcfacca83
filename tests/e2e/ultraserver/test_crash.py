"""``kill -9`` of the UltraServer operator between any two of its writes: restarted, it
converges to the same state. An allocated workload holds exactly one UltraServer in its
status, in the Nodes' records, in the allocator and in its devices' tags, with one
ResourceClaimTemplate; a deleted one leaves no template, record, tag or allocation behind.
The operator stops itself at the write named by its crash-point variable."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest
from neuron_dra_ultraserver_operator.faults import CRASH_ENV, STEPS

from tests.e2e.ultraserver.converged import (
    ULTRASERVERS,
    assert_allocated_once,
    assert_released,
    exists,
    free_ultraservers,
    status_of,
    wait_no_workloads,
    wait_state,
    workload,
)
from tests.e2e.ultraserver.operators import STACK_NAME, Operators
from tests.fixtures.stack import KubeStack

pytestmark = pytest.mark.stack


@pytest.fixture(scope="module")
def operators(us_stack: KubeStack) -> Iterator[Operators]:
    ops = Operators.of(us_stack)
    yield ops
    ops.restore()


@pytest.fixture
def clean(us_stack: KubeStack, operators: Operators) -> KubeStack:
    """A fleet with nothing allocated and a normal operator running."""
    operators.restore()
    wait_no_workloads(us_stack)
    return us_stack


def crash_at(ops: Operators, step: str) -> None:
    """Replace the running operator (``kill -9``) by one that dies at ``step``."""
    ops.stop(STACK_NAME, signal.SIGKILL)
    ops.start(STACK_NAME, env={CRASH_ENV: step})
    ops.wait_ready(STACK_NAME)


def restart(ops: Operators) -> None:
    ops.start(STACK_NAME)
    ops.wait_ready(STACK_NAME)


def delete(stack: KubeStack, name: str) -> None:
    stack.kubectl("delete", "nusw", name, "--timeout=120s", timeout=150)


@pytest.mark.parametrize("step", [s for s in STEPS if s.startswith("allocate:")])
def test_kill_during_allocation_converges(
    clean: KubeStack, operators: Operators, step: str
) -> None:
    stack = clean
    name = f"crash-{step.replace(':', '-')}"
    crash_at(operators, step)
    stack.kubectl("apply", "-f", "-", input=workload(name, size=4))
    assert operators.wait_exited(STACK_NAME, timeout=90) == -signal.SIGKILL
    restart(operators)
    uid = stack.get_json("nusw", name)["metadata"]["uid"]
    try:
        status = wait_state(stack, name, "Allocated")
        assert_allocated_once(stack, name, status)
    finally:
        delete(stack, name)
    assert_released(stack, name, uid)


@pytest.mark.parametrize("step", [s for s in STEPS if s.startswith("delete:")])
def test_kill_during_deletion_leaves_nothing_behind(
    clean: KubeStack, operators: Operators, step: str
) -> None:
    stack = clean
    name = f"crash-{step.replace(':', '-')}"
    crash_at(operators, step)  # the allocation before it runs normally
    stack.kubectl("apply", "-f", "-", input=workload(name, size=4))
    status = wait_state(stack, name, "Allocated")
    uid = stack.get_json("nusw", name)["metadata"]["uid"]
    assert_allocated_once(stack, name, status)
    stack.kubectl("delete", "nusw", name, "--wait=false")
    assert operators.wait_exited(STACK_NAME, timeout=90) == -signal.SIGKILL
    assert exists(stack, "nusw", name), "the finalizer holds the workload while it is released"
    # Its status lets go of the UltraServer before the allocator may give it to another:
    # killed at any step, a workload whose status still names it has not been released.
    if status_of(stack, name).get("allocations"):
        free, _ = free_ultraservers(stack)
        assert free == ULTRASERVERS - 1, f"released while {name}'s status still names it"
    elif step == "delete:cleared":
        assert free_ultraservers(stack)[0] == ULTRASERVERS - 1, "released before the kill"
    restart(operators)
    stack.wait_for(f"{name} deleted", lambda: not exists(stack, "nusw", name), timeout=120)
    assert_released(stack, name, uid)
