"""A workload of more than one UltraServer says whether AWS's EFA driver is installed (the
`EFAReady` condition), beside the decider's conditions; one UltraServer needs no EFA.

The reconciler runs against the in-memory API (``memory_api``), whose status writes merge
conditions per field manager as server-side apply does."""

from __future__ import annotations

from typing import Any

from tests.unit.ultraserver.memory_api import KEY, World


def _conditions(world: World) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in world.status.get("conditions") or ()}


def test_missing_efa_driver_is_shown_with_an_event_and_checked_again() -> None:
    world = World(3, size=4, count=2, strategy="NoOp")
    world.api.efa_installed = False
    world.reconcile()
    conditions = _conditions(world)
    assert world.status["state"] == "Allocated"
    assert {"Allocated", "Ready", "Degraded"} <= set(conditions)
    efa = conditions["EFAReady"]
    assert (efa["status"], efa["reason"]) == ("False", "EFADriverNotInstalled")
    assert "spec.serverCount 2" in efa["message"]
    assert [e["reason"] for e in world.api.events].count("EFADriverNotInstalled") == 1
    assert KEY in world.requeued

    # Looked at again with nothing changed: no second Event, the condition kept.
    world.reconcile()
    assert [e["reason"] for e in world.api.events].count("EFADriverNotInstalled") == 1
    assert _conditions(world)["EFAReady"]["lastTransitionTime"] == efa["lastTransitionTime"]

    world.api.efa_installed = True
    world.requeued.clear()
    world.reconcile()
    conditions = _conditions(world)
    assert conditions["EFAReady"]["status"] == "True"
    assert conditions["Ready"]["status"] == "True"
    assert world.requeued == []


def test_one_ultraserver_needs_no_efa() -> None:
    world = World(3, size=4, count=1, strategy="NoOp")
    world.api.efa_installed = False
    world.reconcile()
    assert world.status["state"] == "Allocated"
    assert "EFAReady" not in _conditions(world)
    assert not any(e["reason"] == "EFADriverNotInstalled" for e in world.api.events)
    assert not any("deviceclasses" in path for _, path in world.api.calls)


def test_a_device_class_it_may_not_read_leaves_the_workload_as_it_was() -> None:
    # An operator deployed with older RBAC (no grant on deviceclasses) still allocates.
    world = World(3, size=4, count=2, strategy="NoOp")
    world.api.efa_installed = None
    world.reconcile()
    assert world.status["state"] == "Allocated"
    assert "EFAReady" not in _conditions(world)
    assert not any(e["reason"] == "EFADriverNotInstalled" for e in world.api.events)
