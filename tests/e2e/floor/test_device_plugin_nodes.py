"""Nodes kept on the device plugin, on the oldest release (1.34, where DRA serves no extended
resource): ``dp-trn2-0`` and ``dp-inf2-0`` of the floor fleet are labelled
``neuron.aws.com/device-management: device-plugin``. Their simulated kubelets run the kubelet's
own device manager, each in a mount namespace of its own (its socket folder is fixed), so the
kubelet itself registers the device plugin, reads its ListAndWatch into the Node and calls
Allocate at pod admission; pods written for AWS's device plugin are placed by the scheduler
extender in the default kube-scheduler. Seen as a user sees it: the Node, the pod and its
annotations, the kubelet's own checkpoint of what Allocate answered, and the Events and
alert of a lost node.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest
from neuron_dra_cli.stack import deviceplugin, state
from neuron_dra_cli.stack.layout import Layout
from neuron_dra_cli.stack.nodes import device_plugins_dir
from neuron_dra_common.topology import InvalidDeviceCount, is_connected_set, visible_cores
from neuron_dra_protos.deviceplugin.v1beta1 import deviceplugin_pb2 as pb

from tests.e2e.health.support import alerts, fault, node_events
from tests.fixtures.extended import NEURON, NEURONCORE, neuron_resources, served
from tests.fixtures.stack import KubeStack, neuron_dra

pytestmark = [pytest.mark.stack, pytest.mark.floor]

NAMESPACE = "device-plugin-nodes"
TRN2 = "dp-trn2-0"
INF2 = "dp-inf2-0"
#: The kubelet's device manager checkpoint, in its (fixed) socket folder.
KUBELET_CHECKPOINT = "kubelet_internal_checkpoint"


@pytest.fixture(scope="module")
def stack(floor_stack: KubeStack) -> KubeStack:
    floor_stack.create_namespace(NAMESPACE)
    return floor_stack


def neuron_pod(name: str, count: int, *, instance_type: str = "", resource: str = NEURON) -> str:
    """A pod written for AWS's device plugin: no node chosen, only ``count`` of ``resource``
    (``aws.amazon.com/neuron`` unless told) and, with ``instance_type``, a node selector on it."""
    selector = {"node.kubernetes.io/instance-type": instance_type} if instance_type else {}
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {
                "nodeSelector": selector,
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {
                        "name": "main",
                        "image": "busybox",
                        "resources": {"limits": {resource: str(count)}},
                    }
                ],
            },
        }
    )


def running(stack: KubeStack, name: str) -> dict[str, Any]:
    """Pod ``name`` once it is Running (its containers admitted by the kubelet)."""
    pod: dict[str, Any] = stack.wait_for(
        f"pod {name} Running",
        lambda: (
            p
            if (p := stack.get_json("pod", name, "-n", NAMESPACE))["status"].get("phase")
            == "Running"
            else None
        ),
        timeout=120,
    )
    return pod


def kubelet_checkpoint(stack: KubeStack, node: str) -> dict[str, Any]:
    """The ``Data`` of the node's kubelet device manager checkpoint."""
    path = device_plugins_dir(Layout(stack.state_dir), node) / KUBELET_CHECKPOINT
    data: dict[str, Any] = json.loads(path.read_text())["Data"]
    return data


def kubelet_allocations(stack: KubeStack, node: str, pod_uid: str) -> dict[str, Any]:
    """What the node's kubelet recorded for ``pod_uid`` in its device manager checkpoint: the
    device ids per resource, and Allocate's answer (environment, device nodes)."""
    entries = kubelet_checkpoint(stack, node)["PodDeviceEntries"] or []
    out: dict[str, Any] = {}
    for e in entries:
        if e["PodUID"] != pod_uid:
            continue
        ids = sorted(i for per_numa in e["DeviceIDs"].values() for i in per_numa)
        answer = pb.ContainerAllocateResponse.FromString(base64.b64decode(e["AllocResp"]))
        out[e["ResourceName"]] = {
            "ids": ids,
            "envs": dict(answer.envs),
            "devices": sorted(d.container_path for d in answer.devices),
        }
    return out


def test_the_device_plugin_not_dra_serves_the_labelled_nodes(stack: KubeStack) -> None:
    expected = {
        TRN2: served(16, 4),
        INF2: served(12, 2),
    }
    for node, resources in expected.items():

        def shown(node: str = node, resources: dict[str, str] = resources) -> bool:
            return neuron_resources(stack, node, "allocatable") == resources

        # From the plugin's ListAndWatch through the kubelet's device manager: the simulated
        # node is given no extended resource of its own.
        stack.wait_for(f"{node}'s Neuron resources from its device plugin", shown, timeout=90)
        assert neuron_resources(stack, node, "capacity") == resources
        registered = kubelet_checkpoint(stack, node)["RegisteredDevices"]
        assert sorted(registered) == sorted(resources)
    # No DRA agent there: no ResourceSlice, no discovery, no kubelet plugin; and no DRA node
    # advertises the device plugin's resources.
    pools = {
        s["spec"]["pool"]["name"]
        for s in stack.get_json("resourceslices", "--field-selector", "spec.driver=neuron.aws.com")[
            "items"
        ]
    }
    assert pools
    assert not pools & {TRN2, INF2}
    assert neuron_resources(stack, "trn2-48xl-0", "capacity") == {}
    current = state.load(stack.state_dir)
    assert current is not None
    names = {c.name for c in current.components}
    for node in (TRN2, INF2):
        assert f"device-plugin-{node}" in names
        assert f"kubelet-plugin-{node}" not in names
        assert f"discovery-{node}" not in names


def test_three_devices_run_on_inf2_in_one_ring_window_allocated_by_the_kubelet(
    stack: KubeStack,
) -> None:
    """The seed's example: three devices fit no trn2 row, so the extender places the pod on
    the inf2 node with a contiguous window of its ring; the kubelet admits it by calling the
    plugin's Allocate for exactly those devices."""
    stack.kubectl("apply", "-f", "-", input=neuron_pod("three", 3))
    try:
        pod = running(stack, "three")
        assert pod["spec"]["nodeName"] == INF2
        chosen = [int(i) for i in pod["metadata"]["annotations"]["AWS_NEURON_IDS"].split(",")]
        assert len(chosen) == 3
        assert is_connected_set("inf2.48xlarge", chosen), chosen
        got = kubelet_allocations(stack, INF2, pod["metadata"]["uid"])
        assert list(got) == [NEURON]
        assert got[NEURON]["ids"] == sorted(f"neuron{i}" for i in chosen)
        assert got[NEURON]["envs"]["NEURON_RT_VISIBLE_CORES"] == visible_cores(chosen, 2)
        assert got[NEURON]["devices"] == sorted(f"/dev/neuron{i}" for i in chosen)
    finally:
        stack.kubectl("delete", "pod", "three", "-n", NAMESPACE, "--wait=true", check=False)


def test_nine_neuroncores_are_cores_zero_to_eight_allocated_by_the_kubelet(
    stack: KubeStack,
) -> None:
    """The seed's ``aws.amazon.com/neuroncore: 9`` pod, on the inf2 node (2 cores per device):
    the extender packs the cores on as few devices as possible, cores 0-8, which are devices 0
    to 3 whole and core 0 of device 4; the kubelet hands the plugin exactly those cores, and the
    container gets their device nodes and visible cores. (On trn2, 9 cores would span 3
    devices, a count its rows refuse.)"""
    name = "nine-cores"
    stack.kubectl(
        "apply",
        "-f",
        "-",
        input=neuron_pod(name, 9, instance_type="inf2.48xlarge", resource=NEURONCORE),
    )
    try:
        pod = running(stack, name)
        assert pod["spec"]["nodeName"] == INF2
        annotations = pod["metadata"]["annotations"]
        assert annotations["AWS_NEURON_IDS"] == "0,1,2,3,4,5,6,7,8"
        assert annotations["NEURON_RESOURCE_TYPE"] == NEURONCORE
        got = kubelet_allocations(stack, INF2, pod["metadata"]["uid"])
        assert list(got) == [NEURONCORE]
        assert got[NEURONCORE]["ids"] == sorted(f"neuroncore{c}" for c in range(9))
        assert got[NEURONCORE]["envs"]["NEURON_RT_VISIBLE_CORES"] == "0-8"
        assert got[NEURONCORE]["devices"] == [f"/dev/neuron{d}" for d in range(5)]
    finally:
        stack.kubectl("delete", "pod", name, "-n", NAMESPACE, "--wait=true", check=False)


@pytest.mark.parametrize(
    ("name", "resource", "count", "reason"),
    [
        # Seven fit an inf2 ring; on trn2, whose rows come in 1, 4, 8 and 16, they do not.
        ("seven", NEURON, 7, str(InvalidDeviceCount("trn2.48xlarge", 7))),
        # Nine cores at 4 per device span 3 trn2 devices, which make no row either.
        (
            "nine-trn2-cores",
            NEURONCORE,
            9,
            "Instance type trn2.48xlarge does not support requests for neuroncore: 9.",
        ),
    ],
)
def test_a_count_the_rules_refuse_stays_pending_with_the_reason(
    stack: KubeStack, name: str, resource: str, count: int, reason: str
) -> None:
    pod_json = neuron_pod(name, count, instance_type="trn2.48xlarge", resource=resource)
    stack.kubectl("apply", "-f", "-", input=pod_json)
    try:

        def message() -> str:
            pod = stack.get_json("pod", name, "-n", NAMESPACE)
            found = [c for c in pod["status"].get("conditions", []) if c["type"] == "PodScheduled"]
            return (
                str(found[0].get("message", "")) if found and found[0]["status"] == "False" else ""
            )

        refused = stack.wait_for(f"{name} refused by the scheduler", message, timeout=60)
        assert reason in refused
        assert "nodeName" not in stack.get_json("pod", name, "-n", NAMESPACE)["spec"]
    finally:
        stack.kubectl("delete", "pod", name, "-n", NAMESPACE, "--wait=true", check=False)


def test_a_faulty_device_leaves_allocatable_until_repaired(stack: KubeStack) -> None:
    """An uncorrectable error on device 5 (the driver's kernel-log line): the health probe
    reports it, the plugin's ListAndWatch marks it unhealthy, and the kubelet takes it out of
    the Node's allocatable; a driver reload brings it back."""

    def allocatable() -> dict[str, str]:
        return neuron_resources(stack, TRN2, "allocatable")

    stack.wait_for("16 devices allocatable", lambda: allocatable().get(NEURON) == "16", timeout=90)
    fault = neuron_dra(
        "dev", "fault", TRN2, "nc", "--device", "5", "--state-dir", str(stack.state_dir)
    )
    assert fault.returncode == 0, fault.stderr
    try:
        stack.wait_for(
            "device 5 out of the allocatable count",
            lambda: allocatable() == served(15, 4),
            timeout=90,
        )
        # Capacity still counts it: the device is there, only unusable.
        assert neuron_resources(stack, TRN2, "capacity")[NEURON] == "16"
    finally:
        repair = neuron_dra(
            "dev", "fault", TRN2, "repair", "--device", "5", "--state-dir", str(stack.state_dir)
        )
        assert repair.returncode == 0, repair.stderr
    stack.wait_for("device 5 back", lambda: allocatable().get(NEURON) == "16", timeout=90)


def test_the_plugin_registers_again_when_the_kubelet_restarts(stack: KubeStack) -> None:
    """A restarted kubelet's device manager empties its socket folder and forgets the
    plugins; the plugin sees the new ``kubelet.sock`` and registers again, so the Node's
    resources come back."""
    log = Layout(stack.state_dir).log(f"{deviceplugin.KIND}-{INF2}")

    def registrations() -> int:
        return sum(
            1
            for line in log.read_text().splitlines()
            if '"registered with the kubelet"' in line and f'"{NEURON}"' in line
        )

    before = registrations()
    assert before >= 1
    restart = neuron_dra("dev", "restart", f"node-{INF2}", "--state-dir", str(stack.state_dir))
    assert restart.returncode == 0, restart.stderr
    stack.wait_for("the plugin to register again", lambda: registrations() > before, timeout=90)
    stack.wait_for(
        f"{INF2}'s devices registered again",
        lambda: neuron_resources(stack, INF2, "allocatable").get(NEURON) == "12",
        timeout=90,
    )


def test_a_lost_device_plugin_node_is_declared_lost_from_its_plugins_heartbeats(
    stack: KubeStack,
) -> None:
    """No discovery agent runs on a device-plugin node: its plugin sends the node's heartbeats
    (while the kubelet answers on its socket), so the failure detector declares the node lost
    within seconds of its death, not the node lifecycle controller's 50 s, with the Event on
    the Node and the alert a user reads."""
    assert not node_events(stack, TRN2, "NodeLost")
    fault(stack, TRN2, "lost")
    killed = time.monotonic()
    [event] = stack.wait_for(
        f"NodeLost on {TRN2}", lambda: node_events(stack, TRN2, "NodeLost"), timeout=60
    )
    seen = time.monotonic() - killed
    assert "no heartbeat" in event["message"], event
    assert seen < 30, f"declared lost {seen:.1f} s after the kill"
    stack.wait_for(
        "NeuronNodeLost in Alertmanager",
        lambda: alerts(stack, alertname="NeuronNodeLost", node=TRN2),
        timeout=90,
    )
