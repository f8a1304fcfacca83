"""RestartAll on the default local stack: a node of the workload's UltraServer dies (kubelet
killed with SIGKILL); the workload is placed again, whole, on a healthy UltraServer, and its
pods are recreated there."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from tests.e2e.failure.test_node_lost import (
    allocate,
    allocated_nodes,
    condition,
    kill_kubelet,
    running_pods,
    status,
    workload_events,
)
from tests.e2e.health.support import node_events
from tests.fixtures.stack import KubeStack

pytestmark = pytest.mark.stack

log = logging.getLogger(__name__)


def test_restart_all_places_everything_again_on_a_healthy_ultraserver(
    default_stack: KubeStack,
) -> None:
    stack = default_stack
    before = allocate(stack, "restart", "RestartAll")
    old = before["allocatedUltraServers"][0]
    old_nodes = allocated_nodes(before)
    victim = old_nodes[0]
    killed = kill_kubelet(stack, victim)
    stack.wait_for(
        f"NodeLost on {victim}", lambda: node_events(stack, victim, "NodeLost"), timeout=120
    )
    declared = time.time()
    log.warning("kill -> NodeLost seen: %.1f s", declared - killed)

    def placed_again() -> dict[str, Any] | None:
        found = status(stack, "restart")
        if found.get("state") == "Allocated" and found["allocatedUltraServers"] != [old]:
            return found
        return None

    after = stack.wait_for("the workload Allocated elsewhere", placed_again, timeout=180)
    log.warning("NodeLost -> re-allocated: %.1f s", time.time() - declared)
    new_nodes = allocated_nodes(after)
    assert set(new_nodes).isdisjoint(old_nodes)
    assert condition(after, "Ready") == "True"
    failed = workload_events(stack, "restart", "NodeFailed")
    assert any(victim in m and "RestartAll" in m for m in failed), failed
    pods = stack.wait_for(
        "4 pods Running on the new UltraServer",
        lambda: (
            (p := running_pods(stack, "restart"))
            and len(p) == 4
            and set(p.values()) <= set(new_nodes)
            and p
        ),
        timeout=300,
    )
    log.warning("kill -> pods Running again: %.1f s", time.time() - killed)
    assert set(pods.values()) <= set(new_nodes)
