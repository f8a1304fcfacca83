"""A Neuron device fails on the local stack; a user sees it where Kubernetes shows health.

Faults are injected with ``neuron-dra dev fault``, which makes the simulated node show what a
real one shows (the driver's kernel log line, its error counter); the node's health probe,
the slice publisher, the kubelet plugin and Kubernetes itself do the rest. Each step is read
back with kubectl: the device's taint on its ResourceSlice, the Node's conditions, the pod's
``allocatedResourcesStatus``, the pod evicted by Kubernetes' device taint eviction, and
``neuron-dra topology show``. The repair (a driver reload) clears all of it.

How long a fault takes to show as a taint is printed (``-s`` shows it), not asserted: the
machine running the tests sets that figure as much as the product does.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.e2e.health.support import (
    claim_and_pod,
    condition,
    device_taints,
    fault,
    resources_status,
    timed_wait,
    topology,
)
from tests.fixtures.stack import KubeStack

pytestmark = pytest.mark.stack

NODE = "trn2-48xl-0"
DEVICE = 6
NAME = f"neurondevice{DEVICE}"
KEY = "neuron.aws.com/hardware-error"


@pytest.fixture
def repaired(kube_stack: KubeStack) -> Iterator[KubeStack]:
    """The shared stack, with the node repaired and the test's objects gone afterwards."""
    yield kube_stack
    fault(kube_stack, NODE, "repair")
    for name in ("health-a", "health-b"):
        kube_stack.kubectl(
            "delete", "pod,resourceclaim", name, "--ignore-not-found", "--wait=false", check=False
        )
    kube_stack.wait_for(
        f"{NODE} without taints",
        lambda: not any(device_taints(kube_stack, NODE).values()),
        timeout=60,
    )


def test_device_fault_shows_as_taint_condition_and_pod_status_then_repair_clears_it(
    repaired: KubeStack,
) -> None:
    stack = repaired
    stack.kubectl(
        "apply", "-f", "-", input=claim_and_pod(name="health-a", node=NODE, device=DEVICE)
    )
    stack.kubectl("wait", "--for=condition=Ready", "pod/health-a", "--timeout=120s", timeout=150)
    stack.wait_for(
        "the pod's device reported healthy",
        lambda: [r["health"] for r in resources_status(stack, "health-a")] == ["Healthy"],
    )
    assert condition(stack, NODE, "NeuronHealth")["reason"] == "NeuronHasNoError"

    # A repairable HBM error: degraded. No new claims, the running pod stays and is told.
    started = time.monotonic()
    fault(stack, NODE, "hbm-repairable", device=DEVICE)
    seconds = timed_wait(
        stack,
        f"the NoSchedule taint on {NAME}",
        lambda: (
            {(t["key"], t["value"], t["effect"]) for t in device_taints(stack, NODE)[NAME]}
            == {(KEY, "HBM_REPAIRABLE_ERROR", "NoSchedule")}
        ),
    )
    print(
        f"\nfault -> taint visible (hbm-repairable, NoSchedule): {seconds:.2f} s after the fault command returned, "
        f"{time.monotonic() - started:.2f} s after it started"
    )
    others = {d: t for d, t in device_taints(stack, NODE).items() if d != NAME}
    assert not any(others.values()), others
    health = condition(stack, NODE, "NeuronHealth")
    assert (health["status"], health["reason"]) == ("True", "NeuronHasError_HBM_REPAIRABLE_ERROR")
    assert "reload-driver-or-reboot" in health["message"]
    ready = condition(stack, NODE, "AcceleratedHardwareReady")
    assert (ready["status"], ready["reason"]) == ("False", "NeuronHasError_HBM_REPAIRABLE_ERROR")
    resources = stack.wait_for(
        "the pod's device reported unhealthy",
        lambda: [r for r in resources_status(stack, "health-a") if r["health"] == "Unhealthy"],
    )
    assert NAME in resources[0]["resourceID"]
    assert "HBM_REPAIRABLE_ERROR" in resources[0]["message"]
    assert "mem_ecc_repairable_uncorrected total 0 -> 1" in resources[0]["message"]
    assert stack.get_json("pod", "health-a")["status"]["phase"] == "Running"
    assert f"[ {DEVICE}~A]" in topology(stack, NODE)

    # An uncorrectable SRAM error: NoExecute. Kubernetes evicts the pod using the device.
    started = time.monotonic()
    fault(stack, NODE, "sram", device=DEVICE)
    seconds = timed_wait(
        stack,
        f"the NoExecute taint on {NAME}",
        lambda: (
            (KEY, "SRAM_UNCORRECTABLE_ERROR", "NoExecute")
            in {(t["key"], t["value"], t["effect"]) for t in device_taints(stack, NODE)[NAME]}
        ),
    )
    print(
        f"fault -> taint visible (sram, NoExecute): {seconds:.2f} s after the fault command returned, "
        f"{time.monotonic() - started:.2f} s after it started"
    )
    health = condition(stack, NODE, "NeuronHealth")
    assert health["reason"] == "NeuronHasError_SRAM_UNCORRECTABLE_ERROR"
    assert "replace-instance" in health["message"]
    stack.wait_for(
        "the pod evicted by device taint eviction",
        lambda: stack.kubectl("get", "pod", "health-a", check=False).returncode != 0,
        timeout=90,
    )
    events = stack.get_json("events", "--field-selector", "involvedObject.name=health-a")
    assert "DeviceTaintManagerEviction" in {e["reason"] for e in events["items"]}
    shown = topology(stack, NODE)
    assert f"[ {DEVICE}!.]" in shown
    assert f"!  {NAME}  {KEY}=SRAM_UNCORRECTABLE_ERROR:NoExecute" in shown

    # The device stays listed, but a new claim for it is not allocated until the repair.
    assert NAME in device_taints(stack, NODE)
    stack.kubectl(
        "apply", "-f", "-", input=claim_and_pod(name="health-b", node=NODE, device=DEVICE)
    )
    stack.wait_for(
        "the scheduler refusing the tainted device",
        lambda: any(
            e["reason"] == "FailedScheduling"
            for e in stack.get_json("events", "--field-selector", "involvedObject.name=health-b")[
                "items"
            ]
        ),
    )
    claim = stack.get_json("resourceclaim", "health-b")
    assert not claim.get("status", {}).get("allocation")

    # The repair (a driver reload): the taint goes, the conditions clear, the pod runs.
    started = time.monotonic()
    fault(stack, NODE, "repair", device=DEVICE)
    seconds = timed_wait(
        stack, f"the taint on {NAME} removed", lambda: device_taints(stack, NODE)[NAME] == []
    )
    print(
        f"repair -> taint removed: {seconds:.2f} s after the fault command returned, "
        f"{time.monotonic() - started:.2f} s after it started"
    )
    stack.wait_for(
        "NeuronHealth back to NeuronHasNoError",
        lambda: condition(stack, NODE, "NeuronHealth").get("reason") == "NeuronHasNoError",
    )
    assert condition(stack, NODE, "AcceleratedHardwareReady")["status"] == "True"
    stack.kubectl("wait", "--for=condition=Ready", "pod/health-b", "--timeout=120s", timeout=150)
    stack.wait_for(
        "the new pod's device reported healthy",
        lambda: [r["health"] for r in resources_status(stack, "health-b")] == ["Healthy"],
    )
    assert "tainted" not in topology(stack, NODE)
