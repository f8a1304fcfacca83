"""One ResourceClaim used by two containers of a pod and by a second pod at the same time
(examples/shared-claims/), through the real kubelet: prepared once, the same devices in every
container, unprepared only when the last pod using it is gone."""

from __future__ import annotations

import os
from typing import Any

import pytest
from neuron_dra_cli.stack.plugin import cdi_root

from tests.e2e.actuate.bus import claim_subject
from tests.e2e.actuate.support import Actuate
from tests.e2e.admin.support import EXAMPLES, container_views, device_paths, stored

pytestmark = pytest.mark.stack

SHARED = EXAMPLES / "shared-claims" / "shared-claim.yaml"
CLAIM = "shared-neurons"


def reserved_for(actuate: Actuate) -> list[str]:
    claim: dict[str, Any] = actuate.stack.get_json("resourceclaim", CLAIM)
    return sorted(r["name"] for r in claim["status"].get("reservedFor") or [])


def test_one_claim_two_containers_and_two_pods(actuate: Actuate) -> None:
    stack = actuate.stack
    stack.kubectl("apply", "-f", str(SHARED))
    try:
        trainer = actuate.wait_running("trainer")
        evaluator = actuate.wait_running("evaluator")
        node = trainer["spec"]["nodeName"]
        assert evaluator["spec"]["nodeName"] == node
        claim = stack.get_json("resourceclaim", CLAIM)
        uid = claim["metadata"]["uid"]
        assert reserved_for(actuate) == ["evaluator", "trainer"]

        # Every container of both pods sees the same four devices and the same environment.
        views = {**container_views(stack, "trainer"), **container_views(stack, "evaluator")}
        assert sorted(views) == ["eval", "profiler", "train"]
        first = views["train"]
        assert len(device_paths(first)) == 4
        assert first["env"]["NEURON_RT_VISIBLE_CORES"]
        for view in views.values():
            assert device_paths(view) == device_paths(first)
            assert view["cdiDevices"] == first["cdiDevices"]
            assert view["env"] == first["env"]

        # Prepared once: one checkpoint entry, one CDI spec, one ClaimPrepared for the audit.
        prepared = claim_subject("prepared", node=node, namespace="default", name=CLAIM)
        unprepared = claim_subject("unprepared", node=node, namespace="default", name=CLAIM)
        assert [e["name"] for e in actuate.checkpoint(node).values()].count(CLAIM) == 1
        spec_file = os.stat(spec_path(actuate, node, uid))
        stack.wait_for("the ClaimPrepared event", lambda: stored(stack, prepared) == 1)
        told_unprepared = stored(stack, unprepared)

        # The first pod goes; the claim stays prepared for the second.
        actuate.delete_pod("trainer")
        stack.wait_for(
            "reservedFor to list only evaluator",
            lambda: reserved_for(actuate) == ["evaluator"],
        )
        assert actuate.checkpoint(node)[uid]["state"] == "PrepareCompleted"
        again = os.stat(spec_path(actuate, node, uid))
        assert (again.st_ino, again.st_mtime_ns) == (spec_file.st_ino, spec_file.st_mtime_ns)
        assert actuate.pod("evaluator")["status"]["phase"] == "Running"
        assert stored(stack, unprepared) == told_unprepared
        assert container_views(stack, "evaluator")["eval"] == views["eval"]

        # The last pod goes: now the claim is unprepared, once.
        actuate.delete_pod("evaluator")
        stack.wait_for(
            "the claim unprepared on its node",
            lambda: uid not in actuate.cdi_specs(node) and uid not in actuate.checkpoint(node),
        )
        stack.wait_for("reservedFor to be empty", lambda: reserved_for(actuate) == [])
        stack.wait_for(
            "the ClaimUnprepared event",
            lambda: stored(stack, unprepared) == told_unprepared + 1,
        )
        assert stored(stack, prepared) == 1
    finally:
        for pod in ("trainer", "evaluator"):
            actuate.delete_pod(pod)
        stack.kubectl("delete", "resourceclaim", CLAIM, "--ignore-not-found")


def spec_path(actuate: Actuate, node: str, uid: str) -> str:
    matches = [p for p in cdi_root(actuate.layout, node).iterdir() if uid in p.name]
    assert len(matches) == 1, matches
    return str(matches[0])
