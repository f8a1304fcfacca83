"""On the oldest supported release (1.34: no device taints) an unhealthy device leaves its
pool until it is repaired, so the scheduler cannot hand it out; and ``dev fault NODE lost``
kills the node's kubelet and agents like a dead machine.

The lost node goes last: this package's modules run in name order, and it is the last test of
the last one.
"""

from __future__ import annotations

import json
import time

import pytest
from neuron_dra_cli import kubebuild

from tests.e2e.health.support import (
    claim_and_pod,
    condition,
    device_taints,
    fault,
    timed_wait,
    topology,
)
from tests.fixtures.stack import KubeStack, neuron_dra

NODE = "trn2-48xl-0"
DEVICE = 6
NAME = f"neurondevice{DEVICE}"


@pytest.mark.stack
@pytest.mark.floor
def test_without_device_taints_an_unhealthy_device_leaves_the_pool_until_repaired(
    floor_stack: KubeStack,
) -> None:
    stack = floor_stack
    version = json.loads(stack.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == f"v{kubebuild.FLOOR_VERSION}"
    stack.wait_for("the node's pool", lambda: NAME in device_taints(stack, NODE), timeout=120)

    started = time.monotonic()
    fault(stack, NODE, "hbm", device=DEVICE)
    seconds = timed_wait(
        stack, f"{NAME} out of the pool", lambda: NAME not in device_taints(stack, NODE)
    )
    print(
        f"\nfault -> device out of the pool (1.34): {seconds:.2f} s after the fault command returned, "
        f"{time.monotonic() - started:.2f} s after it started"
    )
    devices = device_taints(stack, NODE)
    assert len(devices) == 15
    assert not any(devices.values())  # 1.34 keeps no taints: none were sent
    stack.wait_for(
        "NeuronHealth with the HBM error",
        lambda: (
            condition(stack, NODE, "NeuronHealth").get("reason")
            == "NeuronHasError_HBM_UNCORRECTABLE_ERROR"
        ),
    )
    assert f"[ {DEVICE} .]" not in topology(stack, NODE)

    # A claim for exactly that device cannot be allocated while it is out.
    stack.kubectl("apply", "-f", "-", input=claim_and_pod(name="floor-a", node=NODE, device=DEVICE))
    stack.wait_for(
        "the scheduler finding no such device",
        lambda: any(
            e["reason"] == "FailedScheduling"
            for e in stack.get_json("events", "--field-selector", "involvedObject.name=floor-a")[
                "items"
            ]
        ),
    )
    assert not stack.get_json("resourceclaim", "floor-a").get("status", {}).get("allocation")

    started = time.monotonic()
    fault(stack, NODE, "repair", device=DEVICE)
    seconds = timed_wait(stack, f"{NAME} back", lambda: NAME in device_taints(stack, NODE))
    print(
        f"repair -> device back in the pool (1.34): {seconds:.2f} s after the fault command returned, "
        f"{time.monotonic() - started:.2f} s after it started"
    )
    stack.kubectl("wait", "--for=condition=Ready", "pod/floor-a", "--timeout=120s", timeout=150)
    claim = stack.get_json("resourceclaim", "floor-a")
    [result] = claim["status"]["allocation"]["devices"]["results"]
    assert (result["pool"], result["device"]) == (NODE, NAME)


@pytest.mark.stack
@pytest.mark.floor
def test_a_lost_node_is_its_kubelet_and_agents_killed(floor_stack: KubeStack) -> None:
    stack = floor_stack
    proc = neuron_dra("dev", "fault", NODE, "lost", "--state-dir", str(stack.state_dir))
    assert proc.returncode == 0, proc.stderr
    assert f"node-{NODE}" in proc.stdout
    status = neuron_dra("dev", "status", "--state-dir", str(stack.state_dir), "-o", "json")
    components = {c["name"]: c for c in json.loads(status.stdout)["components"]}
    for name in (
        f"node-{NODE}",
        f"discovery-{NODE}",
        f"kubelet-plugin-{NODE}",
        f"health-probe-{NODE}",
    ):
        assert components[name]["up"] is False, components[name]
    assert components["node-trn2-48xl-1"]["up"] is True
    again = neuron_dra("dev", "fault", NODE, "lost", "--state-dir", str(stack.state_dir))
    assert "already down" in again.stdout
