"""``kubectl neuron explain nusw/NAME`` on a workload that cannot be placed: which UltraServers
are whole and healthy, which are partial and why, node by node.

The stack runs the whole product on ``tests/fleets/explain-workload.yaml``: one UltraServer of
four trn2u nodes and one trn2 node outside any UltraServer."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.e2e.explain.test_cli import kubectl_neuron
from tests.e2e.ultraserver.converged import deployment, wait_state, workload
from tests.fixtures.stack import REPO, KubeStack, ultraserver_stack

pytestmark = pytest.mark.stack

FLEET = REPO / "tests" / "fleets" / "explain-workload.yaml"
WORKLOAD = REPO / "examples" / "ultraserver" / "workload.yaml"
NAME = "my-training-job"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeStack]:
    yield from ultraserver_stack(tmp_path_factory.mktemp("exwl"), FLEET, ultraservers=1)


def test_explain_nusw_says_which_ultraservers_are_whole_and_why_not(stack: KubeStack) -> None:
    # AWS's guide's workload (examples/ultraserver/workload.yaml) asks for two UltraServers of
    # four nodes: the fleet has one, so the workload stays Pending.
    (us,) = stack.get_json("nus", "-n", "neuron-dra-driver")["items"]
    us_name = us["metadata"]["name"]
    members = sorted(us["spec"]["topology"], key=lambda m: m["nodeId"])
    cordoned = members[2]["nodeName"]
    stack.kubectl("cordon", cordoned)
    stack.kubectl("apply", "-f", str(WORKLOAD))
    try:
        wait_state(stack, NAME, "Pending")

        # One node cordoned: the only UltraServer is partial, the workload needs two.
        proc = kubectl_neuron(stack, "explain", f"nusw/{NAME}")
        assert proc.returncode == 0, proc.stderr
        text = proc.stdout
        assert text.startswith(
            f"NeuronUltraServerWorkload default/{NAME}: will not be scheduled: "
            "NodeUnschedulable: 0 of 2 4-node units free on 1 trn2u.48xlarge UltraServers"
        ), text
        assert f"UltraServer {us_name}: partial (3 of 4 nodes usable)" in text, text
        assert (
            f"{cordoned} (node 2): NodeUnschedulable: node {cordoned} is cordoned (unschedulable)"
            in text
        ), text

        data = json.loads(kubectl_neuron(stack, "explain", f"nusw/{NAME}", "-o", "json").stdout)
        assert data["summary"]["schedulable"] is False
        assert data["summary"]["blockedBy"]["code"] == "NodeUnschedulable"
        (server,) = data["workload"]["ultraServers"]
        assert server["name"] == us_name
        assert server["state"] == "partial"
        assert {n["node"]: n["ok"] for n in server["nodes"]} == {
            m["nodeName"]: m["nodeName"] != cordoned for m in members
        }
        assert data["workload"]["holds"] == []

        # Uncordoned: the UltraServer is whole and healthy, still one short of two.
        stack.kubectl("uncordon", cordoned)
        text = kubectl_neuron(stack, "explain", f"nusw/{NAME}").stdout
        assert f"UltraServer {us_name}: whole and healthy" in text, text
        assert "NotEnoughDevices: 1 of 2 4-node units free" in text, text
    finally:
        stack.kubectl("uncordon", cordoned, check=False)
        stack.kubectl("delete", "-f", str(WORKLOAD), "--timeout=120s", check=False)


def test_a_workload_pod_is_told_the_nodes_outside_its_ultraserver(stack: KubeStack) -> None:
    stack.kubectl("apply", "-f", "-", input=workload("one-us", size=4))
    try:
        wait_state(stack, "one-us", "Allocated")
        (us,) = stack.get_json("nus", "-n", "neuron-dra-driver")["items"]
        us_name = us["metadata"]["name"]
        outside = [
            n["metadata"]["name"]
            for n in stack.get_json("nodes")["items"]
            if n["metadata"]["labels"].get("node.kubernetes.io/instance-type") == "trn2.48xlarge"
        ]
        # Five pods for the four nodes the workload holds: one waits.
        manifest = deployment("one-us", template="one-us", replicas=5)
        stack.kubectl("apply", "-n", "default", "-f", "-", input=manifest)

        def waiting() -> list[str]:
            pods = stack.get_json("pods", "-n", "default", "-l", "app=one-us")["items"]
            scheduled = [p for p in pods if p["spec"].get("nodeName")]
            if len(pods) != 5 or len(scheduled) != 4:
                return []
            return [p["metadata"]["name"] for p in pods if not p["spec"].get("nodeName")]

        (pod,) = stack.wait_for("four pods placed, one waiting", waiting, timeout=120)
        data = json.loads(kubectl_neuron(stack, "explain", "nusw/one-us", "-o", "json").stdout)
        assert data["workload"]["holds"] == [us_name]
        # Its own allocation and its own pods' claims do not count against it.
        (server,) = data["workload"]["ultraServers"]
        assert server["state"] == "held"
        assert all(n["ok"] for n in server["nodes"]), server
        assert data["workload"]["pendingPods"] == [pod]
        assert data["summary"]["schedulable"] is False
        groups = {tuple(g["nodes"]): [r["code"] for r in g["reasons"]] for g in data["groups"]}
        assert groups[tuple(outside)] == ["NotUltraServerOfWorkload"], groups
        held = tuple(sorted(m["nodeName"] for m in us["spec"]["topology"]))
        # Its own nodes are full: their node devices are held by the other four pods' claims.
        assert "DevicesHeld" in groups[held], groups
        assert "NotUltraServerOfWorkload" not in groups[held], groups
        text = kubectl_neuron(stack, "explain", "nusw/one-us").stdout
        assert f"UltraServer {us_name}: held by this workload" in text, text
        assert (
            f"NotUltraServerOfWorkload: the node is in no UltraServer; the workload holds {us_name}"
            in text
        ), text
    finally:
        stack.kubectl("delete", "deployment", "one-us", "-n", "default", check=False)
        stack.kubectl("delete", "nusw", "one-us", "--timeout=120s", check=False)
