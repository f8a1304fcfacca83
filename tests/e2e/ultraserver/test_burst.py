"""A burst of workloads applied at once is reconciled side by side, not one after another,
and every one ends Allocated on nodes no other workload holds.

Twelve one-node workloads fill the stack's three UltraServers. ``kubectl get -w`` shows
every change of every workload in the order the apiserver made them: how many were
Allocating at the same time tells whether the operator placed them together.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.ultraserver.converged import (
    ULTRASERVERS,
    free_ultraservers,
    node_records,
    wait_no_workloads,
    workload,
)
from tests.fixtures.stack import KubeStack

pytestmark = pytest.mark.stack

#: One workload per node of the fleet.
BURST = ULTRASERVERS * 4


def watched(stack: KubeStack, lines: list[str]) -> tuple[subprocess.Popen[str], threading.Thread]:
    """``kubectl get nusw -w``, one ``name state`` line per change, collected in ``lines``."""
    kubectl = Path(sys.executable).parent / "kubectl"
    proc = subprocess.Popen(
        [
            str(kubectl),
            f"--kubeconfig={stack.kubeconfig}",
            "get",
            "nusw",
            "-w",
            "-o",
            'jsonpath={.metadata.name} {.status.state}{"\\n"}',
        ],
        stdout=subprocess.PIPE,
        text=True,
    )

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.strip())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return proc, reader


def allocated(stack: KubeStack, names: list[str]) -> list[dict[str, Any]] | None:
    """The statuses of ``names`` (in that order) once every one is Allocated."""
    items = {w["metadata"]["name"]: w.get("status") or {} for w in stack.get_json("nusw")["items"]}
    statuses = [items.get(n, {}) for n in names]
    return statuses if all(s.get("state") == "Allocated" for s in statuses) else None


def most_at_once(lines: list[str], names: list[str]) -> int:
    """The most workloads between their first Allocating and their Allocated at one time."""
    busy: set[str] = set()
    done: set[str] = set()
    most = 0
    for line in lines:
        name, _, state = line.partition(" ")
        if name not in names or name in done:
            continue
        if state == "Allocating":
            busy.add(name)
        elif state == "Allocated":
            busy.discard(name)
            done.add(name)
        most = max(most, len(busy))
    return most


def test_a_burst_is_placed_side_by_side_and_no_node_is_held_twice(us_stack: KubeStack) -> None:
    stack = us_stack
    wait_no_workloads(stack)
    names = [f"burst-{i:02d}" for i in range(BURST)]
    lines: list[str] = []
    watch, reader = watched(stack, lines)
    try:
        stack.kubectl("apply", "-f", "-", input="---\n".join(workload(n, size=1) for n in names))
        statuses = stack.wait_for(
            f"all {BURST} workloads Allocated", lambda: allocated(stack, names), timeout=120
        )
        stack.wait_for(
            "the watch saw every Allocated",
            lambda: {n for n in names if f"{n} Allocated" in lines} == set(names),
            timeout=30,
        )
    finally:
        watch.terminate()
        watch.wait(timeout=10)
        reader.join(timeout=10)
        assert watch.stdout is not None
        watch.stdout.close()
    held = Counter(n["nodeName"] for s in statuses for a in s["allocations"] for n in a["nodes"])
    assert len(held) == BURST, f"every node once: {held}"
    assert set(held.values()) == {1}, f"a node held twice: {held}"
    records = node_records(stack)
    uids = {stack.get_json("nusw", n)["metadata"]["uid"]: n for n in names}
    for s, name in zip(statuses, names, strict=True):
        node = s["allocations"][0]["nodes"][0]["nodeName"]
        assert [uids[u] for u in uids if u in records[node]] == [name], records[node]
    # Placed by a few workers in turn, only a few would be Allocating at any one time.
    at_once = most_at_once(lines, names)
    assert at_once >= BURST // 2, (
        f"at most {at_once} of {BURST} workloads were being placed at once"
    )
    stack.kubectl("delete", "nusw", *names, "--timeout=120s", timeout=150)
    wait_no_workloads(stack)
    assert free_ultraservers(stack)[0] == ULTRASERVERS
