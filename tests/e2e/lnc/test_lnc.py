"""The logical NeuronCore config (LNC) a container runs with, from each place that sets it,
through the real kubelet: the node's default (a fleet group's ``lnc``, the driver's
``/opt/aws/neuron/logical_nc_config``) and a NeuronUltraServerWorkload's
``spec.config.logicalNeuronCore`` (the operator's template -> the kubelet plugin's CDI spec).

At LNC 2 a trn2 or Trn3 device shows 4 logical cores, at LNC 1 all 8 of its physical ones;
``NEURON_RT_VISIBLE_CORES`` counts in logical cores, so it says which one is in force."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.ultraserver.converged import pod_env, wait_state
from tests.fixtures.stack import REPO, KubeStack

pytestmark = pytest.mark.stack

EXAMPLES = REPO / "examples"


def running(stack: KubeStack, *names: str) -> dict[str, dict[str, Any]]:
    def check() -> dict[str, dict[str, Any]]:
        pods = {n: stack.get_json("pod", n) for n in names}
        return pods if all(p["status"].get("phase") == "Running" for p in pods.values()) else {}

    result: dict[str, dict[str, Any]] = stack.wait_for(
        f"{', '.join(names)} Running", check, timeout=120
    )
    return result


def allocated_device(stack: KubeStack, pod: dict[str, Any]) -> int:
    """The index of the one Neuron device the pod's claim holds."""
    claim = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    results = stack.get_json("resourceclaim", claim)["status"]["allocation"]["devices"]["results"]
    assert len(results) == 1, results
    return int(results[0]["device"].removeprefix("neurondevice"))


def cores_per_device(stack: KubeStack, node: str) -> str:
    for s in stack.get_json("resourceslices")["items"]:
        if s["spec"].get("nodeName") == node:
            for d in s["spec"].get("devices") or ():
                if d["name"] == "neurondevice0":
                    return str(d["capacity"]["neuronCores"]["value"])
    raise AssertionError(f"no neurondevice0 published for {node}")


def test_the_node_default_lnc_reaches_the_container(lnc_stack: KubeStack) -> None:
    stack = lnc_stack
    # What the scheduler sees: 4 logical cores per device at LNC 2, 8 at LNC 1.
    assert cores_per_device(stack, "lnc2-trn2-0") == "4"
    assert cores_per_device(stack, "lnc1-trn2-0") == "8"
    assert cores_per_device(stack, "lnc1-trn3-0") == "8"

    stack.kubectl("apply", "-f", str(EXAMPLES / "lnc" / "node-default.yaml"))
    pods = running(stack, "lnc-node-default-2", "lnc-node-default-1")

    two = pods["lnc-node-default-2"]
    assert two["spec"]["nodeName"] == "lnc2-trn2-0"
    d = allocated_device(stack, two)
    env = pod_env(stack, "lnc-node-default-2")
    assert env["NEURON_LOGICAL_NC_CONFIG"] == "2"
    assert env["NEURON_RT_VISIBLE_CORES"] == f"{4 * d}-{4 * d + 3}"

    one = pods["lnc-node-default-1"]
    assert one["spec"]["nodeName"] == "lnc1-trn2-0"
    d = allocated_device(stack, one)
    env = pod_env(stack, "lnc-node-default-1")
    assert env["NEURON_LOGICAL_NC_CONFIG"] == "1"
    assert env["NEURON_RT_VISIBLE_CORES"] == f"{8 * d}-{8 * d + 7}"

    stack.kubectl("delete", "-f", str(EXAMPLES / "lnc" / "node-default.yaml"), "--timeout=60s")


def test_a_claim_config_wins_over_the_node_default(lnc_stack: KubeStack) -> None:
    """AWS's ``lnc-setting-trn2.yaml`` (the whole node at LNC 1) on the node left at 2."""
    stack = lnc_stack
    guide = EXAMPLES / "aws-dra-guide" / "v1" / "lnc-setting-trn2.yaml"
    manifest = guide.read_text().replace(
        "spec:\n  containers:",
        "spec:\n  nodeSelector:\n    kubernetes.io/hostname: lnc2-trn2-0\n  containers:",
    )
    stack.kubectl("apply", "-f", "-", input=manifest)
    running(stack, "pod0")
    env = pod_env(stack, "pod0")
    assert env["NEURON_LOGICAL_NC_CONFIG"] == "1"
    assert env["NEURON_RT_VISIBLE_CORES"] == "0-127"
    stack.kubectl("delete", "-f", "-", "--timeout=60s", input=manifest)


def test_the_workload_lnc_reaches_the_container(lnc_stack: KubeStack) -> None:
    stack = lnc_stack
    example = EXAMPLES / "ultraserver" / "trn3-lnc-workload.yaml"
    stack.kubectl("apply", "-f", str(example))
    for name in ("lnc-one", "lnc-default"):
        wait_state(stack, name, "Allocated")
    # The operator passes the workload's value (the CRD's default 2 when not given) on in
    # the generated template, as a NeuronConfig for the kubelet plugin.
    for name, want in (("lnc-one", 1), ("lnc-default", 2)):
        rct = stack.get_json("resourceclaimtemplates", name)
        configs = [c["opaque"]["parameters"] for c in rct["spec"]["spec"]["devices"]["config"]]
        assert {
            "apiVersion": "neuron.aws.com/v1",
            "kind": "NeuronConfig",
            "logicalNeuronCore": want,
        } in configs

    pods = running(stack, "lnc-one", "lnc-default")
    assert {p["spec"]["nodeName"] for p in pods.values()} <= {f"lnc1-trn3-{i}" for i in range(4)}
    one = pod_env(stack, "lnc-one")
    assert one["NEURON_LOGICAL_NC_CONFIG"] == "1"
    assert one["NEURON_RT_VISIBLE_CORES"] == "0-127"  # 16 devices x 8
    # The workload's config wins over the node's own LNC 1, as a claim's does.
    default = pod_env(stack, "lnc-default")
    assert default["NEURON_LOGICAL_NC_CONFIG"] == "2"
    assert default["NEURON_RT_VISIBLE_CORES"] == "0-63"  # 16 devices x 4
    for env in (one, default):
        assert env["NEURON_RT_ULTRASERVER_MODE"] == "4"  # the driver's single-node mode

    stack.kubectl("delete", "pod", "lnc-one", "lnc-default", "--timeout=60s")
    stack.kubectl("delete", "nusw", "lnc-one", "lnc-default", "--timeout=120s")
