"""AWS's Neuron UltraServer operator guide end to end on the local stack, and the sizes,
waiting and racing around it."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from tests.e2e.ultraserver.converged import pod_env, status_of, wait_state, workload
from tests.fixtures.stack import REPO, KubeStack

pytestmark = pytest.mark.stack

EXAMPLES = REPO / "examples" / "ultraserver"
NS = "neuron-dra-driver"


def delete(stack: KubeStack, *names: str) -> None:
    stack.kubectl("delete", "nusw", *names, "--timeout=120s")


def test_operator_guide_workload_deployment_and_cascade(us_stack: KubeStack) -> None:
    stack = us_stack
    stack.kubectl("apply", "-f", str(EXAMPLES / "workload.yaml"))
    status = wait_state(stack, "my-training-job", "Allocated")
    assert status["totalNodesAllocated"] == 8
    assert len(status["allocatedUltraServers"]) == 2
    nodes = {n["nodeName"] for a in status["allocations"] for n in a["nodes"]}
    assert len(nodes) == 8
    rct = stack.get_json("resourceclaimtemplates", "my-training-job-rct")
    assert rct["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] == 1
    for name in status["allocatedUltraServers"]:
        nus = stack.get_json("nus", "-n", NS, name)
        assert nus["status"]["state"] == "FullyAllocated"
        assert nus["status"]["allocations"][0]["workloadRef"] == "default/my-training-job"
        assert nus["status"]["allocations"][0]["phase"] == "Bound"

    # Every device of an allocated node is tagged with the workloadId.
    def tagged() -> bool:
        slices = stack.get_json("resourceslices")["items"]
        node_devices = [
            d
            for s in slices
            if s["spec"].get("nodeName") in nodes
            for d in s["spec"].get("devices") or ()
        ]
        return bool(node_devices) and all(
            (d["attributes"].get("workloadId") or {}).get("string") == "my-training-job"
            for d in node_devices
        )

    stack.wait_for("workloadId on the allocated nodes' devices", tagged, timeout=60)

    stack.kubectl("apply", "-f", str(EXAMPLES / "deployment.yaml"))

    def running() -> list[dict[str, Any]]:
        pods = stack.get_json("pods", "-l", "app=ultraserver-training")["items"]
        ok = [p for p in pods if p["status"].get("phase") == "Running"]
        return ok if len(ok) == 8 else []

    pods = stack.wait_for("8 Running pods", running, timeout=180)
    assert {p["spec"]["nodeName"] for p in pods} == nodes
    envs = [pod_env(stack, p["metadata"]["name"]) for p in pods]
    assert sorted(int(e["NEURON_GLOBAL_TOPOID"]) for e in envs) == list(range(8))
    hosts = {e["NEURON_GLOBAL_TOPOID0_HOST"] for e in envs}
    assert len(hosts) == 1
    assert hosts <= nodes
    assert {e["NEURON_RT_ULTRASERVER_MODE"] for e in envs} == {"1"}
    assert {e["NEURON_LOGICAL_NC_CONFIG"] for e in envs} == {"2"}

    delete(stack, "my-training-job")
    gone = stack.kubectl("get", "resourceclaimtemplates", "my-training-job-rct", check=False)
    assert gone.returncode != 0
    stack.wait_for(
        "the workload's pods gone or waiting without a template",
        lambda: (
            not any(
                p["status"].get("phase") == "Running"
                for p in stack.get_json("pods", "-l", "app=ultraserver-training")["items"]
            )
        ),
        timeout=120,
    )
    stack.kubectl("delete", "deployment", "my-training-workload-deployment", "--timeout=60s")
    for name in status["allocatedUltraServers"]:

        def available(n: str = name) -> bool:
            return bool(stack.get_json("nus", "-n", NS, n)["status"]["state"] == "Available")

        stack.wait_for(f"{name} Available", available, timeout=60)
    for node in nodes:
        annotations = stack.get_json("node", node)["metadata"].get("annotations") or {}
        assert "neuron.aws.com/ultraserver-allocation" not in annotations


def test_sizes_one_and_two(us_stack: KubeStack) -> None:
    stack = us_stack
    stack.kubectl("apply", "-f", "-", input=workload("one", size=1))
    stack.kubectl("apply", "-f", "-", input=workload("two", size=2, count=2))
    one = wait_state(stack, "one", "Allocated")
    two = wait_state(stack, "two", "Allocated")
    assert one["totalNodesAllocated"] == 1
    assert two["totalNodesAllocated"] == 4
    for allocation in two["allocations"]:
        ids = sorted(n["nodeId"] for n in allocation["nodes"])
        assert ids in ([0, 1], [2, 3])  # vertical pairs first
        assert allocation["mode"] == 3
    assert sorted(n["topologyId"] for a in two["allocations"] for n in a["nodes"]) == [0, 1, 2, 3]
    delete(stack, "one", "two")


def test_too_large_waits_with_the_reason_then_fits(us_stack: KubeStack) -> None:
    stack = us_stack
    stack.kubectl("apply", "-f", "-", input=workload("holder", size=4))
    wait_state(stack, "holder", "Allocated")
    stack.kubectl("apply", "-f", "-", input=workload("wide", size=4, count=3))
    pending = wait_state(stack, "wide", "Pending")
    assert "taken by workload default/holder" in pending["message"]
    events = stack.kubectl("describe", "nusw", "wide").stdout
    assert "AllocationPending" in events
    delete(stack, "holder")
    allocated = wait_state(stack, "wide", "Allocated", timeout=90)
    assert allocated["totalNodesAllocated"] == 12
    delete(stack, "wide")


def test_two_workloads_race_for_the_last_ultraserver(us_stack: KubeStack) -> None:
    stack = us_stack
    stack.kubectl("apply", "-f", "-", input=workload("base", size=4, count=2))
    wait_state(stack, "base", "Allocated")
    both = workload("racer-a", size=4) + "---\n" + workload("racer-b", size=4)
    stack.kubectl("apply", "-f", "-", input=both)

    def settled() -> list[str]:
        states = [status_of(stack, n).get("state") for n in ("racer-a", "racer-b")]
        return (
            sorted(s or "" for s in states) if "Allocated" in states and "Pending" in states else []
        )

    assert stack.wait_for("one winner", settled, timeout=60) == ["Allocated", "Pending"]
    delete(stack, "base", "racer-a", "racer-b")


def test_dra_guide_ultraserver_template_gets_the_ultraserver_variables(us_stack: KubeStack) -> None:
    stack = us_stack
    template = REPO / "examples" / "aws-dra-guide" / "v1" / "us-4-node-config.yaml"
    stack.kubectl("apply", "-f", str(template))
    pod = textwrap.dedent(
        """\
        apiVersion: v1
        kind: Pod
        metadata:
          name: us-pod
        spec:
          containers:
          - name: ctr0
            image: public.ecr.aws/ubuntu/ubuntu:22.04
            command: ["sleep", "infinity"]
            resources:
              claims:
              - name: node
          resourceClaims:
          - name: node
            resourceClaimTemplateName: us-4-node-config
        """
    )
    stack.kubectl("apply", "-f", "-", input=pod)
    stack.wait_for(
        "us-pod Running",
        lambda: stack.get_json("pod", "us-pod")["status"].get("phase") == "Running",
        timeout=120,
    )
    node = stack.get_json("pod", "us-pod")["spec"]["nodeName"]
    labels = stack.get_json("node", node)["metadata"]["labels"]
    env = pod_env(stack, "us-pod")
    assert env["NEURON_RT_ULTRASERVER_MODE"] == "1"
    assert (
        env["NEURON_RT_ULTRASERVER_SERVER_ID"]
        == labels["neuron.amazonaws.com/ultraserver-server-id-4"]
    )
    assert (
        env["NEURON_RT_ULTRASERVER_NODE_ID"] == labels["neuron.amazonaws.com/ultraserver-node-id-4"]
    )
    assert env["NEURON_GLOBAL_TOPOID"] == labels["neuron.amazonaws.com/ultraserver-node-id-4"]
    prefix = node.rsplit("-", 1)[0]
    assert env["NEURON_GLOBAL_TOPOID0_HOST"] == f"{prefix}-0"
    stack.kubectl("delete", "pod", "us-pod", "--timeout=60s")
