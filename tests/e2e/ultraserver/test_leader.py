"""Two UltraServer operators on one cluster: the one holding the Lease reconciles and is the
only one that writes; killed, the other takes over and finishes what was left (a deletion
and a new workload submitted while no one led)."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from tests.e2e.ultraserver.converged import (
    assert_allocated_once,
    assert_released,
    exists,
    wait_no_workloads,
    wait_state,
    workload,
)
from tests.e2e.ultraserver.operators import LEASE, STACK_NAME, Operators
from tests.fixtures.stack import KubeStack

pytestmark = pytest.mark.stack

ALLOCATED = ("neuron_dra_operator_workloads", (("state", "Allocated"),))
TIMED = ("neuron_dra_operator_allocation_seconds_count", ())


@pytest.fixture
def operators(us_stack: KubeStack) -> Iterator[Operators]:
    ops = Operators.of(us_stack)
    try:
        yield ops
    finally:
        ops.restore()


def leading(ops: Operators, name: str) -> float:
    return ops.metrics(name).get(("neuron_dra_leader", (("lease", LEASE),)), 0.0)


def test_one_operator_writes_and_the_standby_takes_over(
    us_stack: KubeStack, operators: Operators
) -> None:
    stack, ops = us_stack, operators
    wait_no_workloads(stack)
    ops.stop(STACK_NAME)  # cleanly: the Lease is handed back
    # Short enough for a quick takeover, long enough that a busy machine (every other stack of
    # the session still running) does not make the leader miss a renewal.
    fast = {"NEURON_DRA_LEASE_SECONDS": "10"}
    ops.start("operator-a", env={**fast, "NEURON_DRA_IDENTITY": "operator-a"})
    ops.wait_ready("operator-a")
    stack.wait_for("operator-a to lead", lambda: ops.holder() == "operator-a", timeout=30)
    ops.start("operator-b", env={**fast, "NEURON_DRA_IDENTITY": "operator-b"})
    ops.wait_ready("operator-b")

    stack.kubectl("apply", "-f", "-", input=workload("leader-first", size=4))
    first = wait_state(stack, "leader-first", "Allocated")
    first_uid = stack.get_json("nusw", "leader-first")["metadata"]["uid"]
    assert_allocated_once(stack, "leader-first", first)
    assert ops.holder() == "operator-a"
    assert (leading(ops, "operator-a"), leading(ops, "operator-b")) == (1.0, 0.0)
    assert ops.writes("operator-b") == {}, "the standby wrote"
    written = ops.writes("operator-a")
    assert written.get("PATCH neuronultraserverworkloads/status"), written
    assert written.get("PATCH nodes"), written
    # Both replicas count the workloads by state (their caches are warm); only the leader
    # timed an allocation.
    for name in ("operator-a", "operator-b"):

        def counted(n: str = name) -> bool:
            return ops.metrics(n).get(ALLOCATED) == 1.0

        stack.wait_for(f"{name} counts one Allocated workload", counted, timeout=30)
    assert ops.metrics("operator-a").get(TIMED, 0.0) >= 1.0
    assert ops.metrics("operator-b").get(TIMED, 0.0) == 0.0

    # The leader dies; meanwhile one workload is deleted and another submitted.
    ops.stop("operator-a", signal.SIGKILL)
    stack.kubectl("delete", "nusw", "leader-first", "--wait=false")
    stack.kubectl("apply", "-f", "-", input=workload("leader-second", size=4))
    stack.wait_for("operator-b to lead", lambda: ops.holder() == "operator-b", timeout=30)
    assert leading(ops, "operator-b") == 1.0
    try:
        second = wait_state(stack, "leader-second", "Allocated")
        stack.wait_for(
            "leader-first deleted", lambda: not exists(stack, "nusw", "leader-first"), timeout=90
        )
        assert_released(stack, "leader-first", first_uid, held_by_others=1)
        assert_allocated_once(stack, "leader-second", second)
    finally:
        # Whatever failed above, the next tests find the UltraServers free.
        stack.kubectl(
            "delete", "nusw", "leader-first", "leader-second", "--ignore-not-found",
            "--timeout=120s", timeout=150,
        )  # fmt: skip
