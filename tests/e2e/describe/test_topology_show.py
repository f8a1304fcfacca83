"""``neuron-dra topology show`` against the cluster: a claim on an UltraServer node's
whole-node device holds every Neuron device of the node, in text and in JSON."""

from __future__ import annotations

import json

import pytest

from tests.e2e.describe.support import allocation, bound, create, example, pod
from tests.fixtures.stack import KubeStack, neuron_dra

pytestmark = pytest.mark.stack

NODE = "us0-trn2u-48xl-3"


def show(stack: KubeStack, *extra: str) -> str:
    proc = neuron_dra(
        "topology", "show", NODE, "--kubeconfig", str(stack.kubeconfig), *extra, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_a_claim_on_the_node_device_holds_all_sixteen_devices(
    describe_stack: KubeStack, ns: str
) -> None:
    free = json.loads(show(describe_stack, "-o", "json"))
    assert (free["devices"], free["held"]) == (16, 0)

    describe_stack.kubectl("apply", "-n", ns, "-f", str(example("v1", "us-4-node-config.yaml")))
    create(describe_stack, ns, pod("whole", "us-4-node-config", node=NODE))
    assert bound(describe_stack, ns, "whole") == NODE
    assert allocation(describe_stack, ns, "whole")[1] == ["neuronnode"]

    text = show(describe_stack)
    assert "(16 devices, 16 held)" in text
    assert "node device neuronnode (whole node): held by A (all 16 devices)" in text
    assert "row 3 [12 A]-[13 A]-[14 A]-[15 A]  ↺" in text
    holder = next(line.split()[1] for line in text.splitlines() if line.startswith("  A  "))
    assert holder.startswith(f"{ns}/whole-")

    shown = json.loads(show(describe_stack, "-o", "json"))
    assert (shown["devices"], shown["held"]) == (16, 16)
    assert {chip["heldBy"] for chip in shown["chips"]} == {holder}
    assert shown["nodeDevices"] == [{"name": "neuronnode", "heldBy": holder, "taints": []}]
