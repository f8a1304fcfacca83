"""A workload that is Allocated and stays so is looked at again often (its own status
writes, its nodes' changes, the resync): those passes ask and read, and write nothing.

The reconciler runs against the in-memory API of ``memory_api``, which records every request.
"""

from __future__ import annotations

import copy
from typing import Any

from tests.unit.ultraserver.memory_api import KEY, Api, World

WRITES = ("POST", "PUT", "PATCH", "DELETE")


def test_an_allocated_workload_passed_again_writes_nothing() -> None:
    world = World(2, size=4, count=1, strategy="NoOp")
    world.reconcile()
    assert world.status["state"] == "Allocated"
    assert any("resourceclaimtemplates" in path for m, path in world.api.calls if m == "POST")
    world.api.calls.clear()
    for _ in range(3):
        world.reconcile()
    assert world.status["state"] == "Allocated"
    assert [c for c in world.api.calls if c[0] in WRITES] == []
    # The template is still looked at each time: one that was deleted is made again.
    assert "GET" in {m for m, path in world.api.calls if "resourceclaimtemplates" in path}


def test_a_template_changed_by_someone_else_is_applied_again() -> None:
    world = World(2, size=4, count=1, strategy="NoOp")
    world.reconcile()
    (name,) = world.api.templates
    world.api.templates[name]["metadata"]["labels"] = {}
    world.api.calls.clear()
    world.reconcile()
    assert [m for m, path in world.api.calls if "resourceclaimtemplates" in path] == [
        "GET",
        "PATCH",
    ]
    assert world.api.templates[name]["metadata"]["labels"]


def test_passes_before_the_informer_shows_the_operators_writes_repeat_none() -> None:
    """The informer is behind the operator's own writes (under load it lags by seconds):
    the passes its echoes start decide on what the operator wrote, not again."""
    cache: dict[str, Any] = {}

    def lagging(api: Api) -> dict[str, Any]:
        cache.update(copy.deepcopy(api.workloads))  # as created: no status, no finalizer
        return cache

    world = World(2, size=4, count=1, strategy="NoOp", workload_cache=lagging)
    world.reconcile()
    assert world.status["state"] == "Allocated"
    assert "status" not in cache[KEY]
    world.api.calls.clear()
    world.reconcile()
    assert [c for c in world.api.calls if c[0] in WRITES] == []
    # Someone else's newer version (here: the user deletes it) is taken as it comes.
    cache[KEY] = copy.deepcopy(world.api.workloads[KEY])
    cache[KEY]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    cache[KEY]["metadata"]["resourceVersion"] = "99"
    world.api.workloads[KEY]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    world.reconcile()
    assert world.status["state"] == "Deallocating"
