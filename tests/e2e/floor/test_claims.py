"""The product on the oldest supported release (1.34), where the cluster keeps no shared
counters: the upstream test driver's claim as a baseline, then AWS's Neuron DRA driver guide
(connected devices, LNC 1) through our kubelet plugin, and AWS's UltraServer operator flow
with UltraServer nodes published as one whole-node device each (node-only)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from neuron_dra_cli import kubebuild
from neuron_dra_common.driver import NODE_DEVICE

from tests.e2e.actuate.support import Actuate, guide_1x4_running, guide_lnc1_running
from tests.e2e.ultraserver.converged import deployment, pod_env, wait_state, workload
from tests.e2e.upstream_driver import run_claim_lifecycle
from tests.fixtures.stack import KubeStack

pytestmark = [pytest.mark.stack, pytest.mark.floor]

ULTRASERVER_NODES = 4


def pool_devices(stack: KubeStack, node: str) -> list[str]:
    """Device names in ``node``'s pool, as the scheduler sees them."""
    return sorted(
        d["name"]
        for s in stack.get_json("resourceslices")["items"]
        if s["spec"].get("pool", {}).get("name") == node
        for d in s["spec"].get("devices") or []
    )


def test_release_and_the_upstream_drivers_claim(floor_stack: KubeStack, tmp_path: Path) -> None:
    version = json.loads(floor_stack.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == f"v{kubebuild.FLOOR_VERSION}"
    nodes = floor_stack.get_json("nodes")["items"]
    assert {n["status"]["nodeInfo"]["kubeletVersion"] for n in nodes} == {
        f"v{kubebuild.FLOOR_VERSION}"
    }
    run_claim_lifecycle(floor_stack, tmp_path)


def test_connected_devices_claim_from_the_guide(floor_actuate: Actuate) -> None:
    actuate = floor_actuate
    try:
        node, claim, _, _ = guide_1x4_running(actuate, timeout=180)
        assert node.startswith("trn2-48xl-")
        uid = claim["metadata"]["uid"]
    finally:
        actuate.delete_pod("pod0")
    assert uid not in actuate.cdi_specs(node)
    assert uid not in actuate.checkpoint(node)


def test_all_devices_at_lnc_1_from_the_guide(floor_actuate: Actuate) -> None:
    actuate = floor_actuate
    try:
        guide_lnc1_running(actuate, timeout=180)
    finally:
        actuate.delete_pod("pod0")


def test_ultraserver_workload_in_node_only_mode(floor_stack: KubeStack) -> None:
    stack = floor_stack

    def described() -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = stack.get_json("nus", "-n", "neuron-dra-driver")["items"]
        return items if items and len(items[0]["spec"].get("topology") or ()) == 4 else []

    nus = stack.wait_for("the NeuronUltraServer and its four nodes", described, timeout=120)
    assert len(nus) == 1
    members = sorted(n["nodeName"] for n in nus[0]["spec"]["topology"])
    # No shared counters on 1.34: an UltraServer node is one whole-node device, no chips.
    for node in members:

        def node_only(n: str = node) -> bool:
            return pool_devices(stack, n) == [NODE_DEVICE]

        stack.wait_for(f"{node}'s node-only pool", node_only, timeout=120)

    stack.kubectl("apply", "-f", "-", input=workload("floor-job", size=ULTRASERVER_NODES, count=1))
    status = wait_state(stack, "floor-job", "Allocated", timeout=180)
    assert status["totalNodesAllocated"] == ULTRASERVER_NODES
    allocated = {n["nodeName"] for a in status["allocations"] for n in a["nodes"]}
    assert allocated == set(members)
    rct = "floor-job"  # no template name in the spec: the workload's own name
    stack.wait_for(
        "the generated ResourceClaimTemplate",
        lambda: stack.kubectl("get", "resourceclaimtemplates", rct, check=False).returncode == 0,
        timeout=60,
    )
    stack.kubectl(
        "apply",
        "-f",
        "-",
        input=deployment("floor-training", template=rct, replicas=ULTRASERVER_NODES),
    )
    try:

        def running() -> list[dict[str, Any]]:
            pods = stack.get_json("pods", "-l", "app=floor-training")["items"]
            ok = [p for p in pods if p["status"].get("phase") == "Running"]
            return ok if len(ok) == ULTRASERVER_NODES else []

        pods = stack.wait_for(f"{ULTRASERVER_NODES} Running pods", running, timeout=240)
        assert {p["spec"]["nodeName"] for p in pods} == allocated
        envs = [pod_env(stack, p["metadata"]["name"]) for p in pods]
        assert sorted(int(e["NEURON_GLOBAL_TOPOID"]) for e in envs) == list(
            range(ULTRASERVER_NODES)
        )
        assert len({e["NEURON_GLOBAL_TOPOID0_HOST"] for e in envs}) == 1
        assert {e["NEURON_RT_ULTRASERVER_MODE"] for e in envs} == {"1"}
    finally:
        stack.kubectl("delete", "deployment", "floor-training", "--timeout=120s", check=False)
        stack.kubectl("delete", "nusw", "floor-job", "--timeout=120s", check=False)
