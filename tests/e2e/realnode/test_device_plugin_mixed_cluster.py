"""A mixed cluster (``dev up --real-nodes 1 --real-node-device-plugin``): the device plugin's
DaemonSet on the real node, labelled ``neuron.aws.com/device-management=device-plugin``, the
scheduler extender in kube-scheduler, and DRA agents on the simulated node, seen with kubectl.

The real node has no Neuron hardware: it gets a simulated trn2.48xlarge (the files the plugin
reads), whose ``/dev/neuronN`` are character devices (major 240, the kernel's
"local/experimental" range; minor N), so containerd can read them and runc can make them in
the container.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from typing import Any

import pytest
from neuron_dra_cli.stack import busauth, realdeviceplugin, realdriver
from neuron_dra_cli.stack.layout import Layout
from neuron_dra_common.bus import Bus, BusCredentials
from neuron_dra_common.events import DeviceHealthChanged
from neuron_dra_common.hardware.layout import NodePaths
from neuron_dra_common.topology import InvalidDeviceCount, is_connected_set, visible_cores

from tests.e2e.realnode.busauth.test_driver_on_the_authenticated_bus import callout_log
from tests.e2e.realnode.conftest import REAL_NODE, import_base
from tests.fixtures.extended import NEURON, neuron_resources, served
from tests.fixtures.stack import REPO, KubeStack

NAMESPACE = "device-plugin-test"
DRIVER_NAMESPACE = "neuron-dra-driver"
DRA_NODE = "dra-trn2-0"
INSTANCE = "trn2.48xlarge"
CORES_PER_DEVICE = 4  # trn2 at its default logical core config (2)
GUIDE_1X4 = REPO / "examples" / "aws-dra-guide" / "v1" / "1x4-connected-devices.yaml"

# What the container prints: its visible cores, then each /dev/neuronN with its minor number,
# and stays (its devices stay taken while the test looks).
REPORT = (
    "import os, glob, time\n"
    "print('NEURON_RT_VISIBLE_CORES=' + os.environ.get('NEURON_RT_VISIBLE_CORES', ''))\n"
    "for path in sorted(glob.glob('/dev/neuron*'), key=lambda p: int(p[len('/dev/neuron'):])):\n"
    "    print(path, os.minor(os.stat(path).st_rdev))\n"
    "print('end', flush=True)\n"
    "time.sleep(600)\n"
)


@pytest.fixture(scope="module")
def stack(device_plugin_stack: KubeStack) -> KubeStack:
    return device_plugin_stack


@pytest.fixture(scope="module")
def base(stack: KubeStack) -> str:
    return import_base(stack, namespace=NAMESPACE)


def neuron_pod(name: str, *, image: str, count: int) -> str:
    """A pod written for AWS's device plugin: no node chosen, only ``aws.amazon.com/neuron``."""
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {
                        "name": "main",
                        "image": image,
                        "imagePullPolicy": "Never",
                        "command": ["python3", "-c", REPORT],
                        "resources": {"limits": {NEURON: str(count)}},
                    }
                ],
            },
        }
    )


def report(stack: KubeStack, name: str) -> str:
    """Pod ``name``'s log once it has printed all it prints."""
    log: str = stack.wait_for(
        f"pod {name}'s report",
        lambda: (
            (out := stack.kubectl("logs", name, "-n", NAMESPACE, check=False).stdout).endswith(
                "end\n"
            )
            and out
        ),
        timeout=120,
    )
    return log.removesuffix("end\n")


def devices_in(log: str) -> list[int]:
    """The minor numbers of the container's /dev/neuronN, checked against their names."""
    out = []
    for line in log.splitlines()[1:]:
        path, minor = line.split()
        assert path == f"/dev/neuron{minor}", line
        out.append(int(minor))
    return out


def plugin_log(stack: KubeStack) -> str:
    return stack.kubectl(
        "logs", "-n", DRIVER_NAMESPACE, f"daemonset/{realdeviceplugin.DAEMONSET}"
    ).stdout


def test_the_device_plugin_runs_on_the_labelled_real_node_only(stack: KubeStack) -> None:
    pods = stack.get_json(
        "pods", "-n", DRIVER_NAMESPACE, "-l", f"app.kubernetes.io/name={realdeviceplugin.DAEMONSET}"
    )["items"]
    assert [(p["spec"]["nodeName"], p["status"]["phase"]) for p in pods] == [(REAL_NODE, "Running")]
    image = pods[0]["spec"]["containers"][0]["image"]
    assert image.startswith("localhost/neuron-dra:0.1.0"), image
    labels = stack.get_json("node", REAL_NODE)["metadata"]["labels"]
    assert labels["neuron.aws.com/device-management"] == "device-plugin"
    assert (
        "neuron.aws.com/device-management"
        not in (stack.get_json("node", DRA_NODE)["metadata"]["labels"])
    )


def test_the_extender_calls_the_api_as_its_own_service_account(stack: KubeStack) -> None:
    # Its kubeconfig holds a token of the component's ServiceAccount, not admin's: the
    # component's ClusterRole is what it runs with.
    own = Layout(stack.state_dir).component_kubeconfig(realdeviceplugin.EXTENDER_KIND)

    def as_extender(*args: str) -> str:
        return stack.kubectl("--kubeconfig", str(own), *args, check=False).stdout.strip()

    assert as_extender("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}") == (
        f"system:serviceaccount:{DRIVER_NAMESPACE}:{realdeviceplugin.EXTENDER_ACCOUNT}"
    )
    assert as_extender("auth", "can-i", "create", "pods", "--subresource=binding") == "yes"
    assert as_extender("auth", "can-i", "delete", "pods", "-A") == "no"
    assert as_extender("auth", "can-i", "patch", "nodes") == "no"


def test_the_plugin_is_admitted_to_the_bus_as_itself_on_its_node(stack: KubeStack) -> None:
    # The callout names whom it admitted: the node is the one the plugin's pod-bound token
    # names, not one the client claimed.
    def admitted() -> str:
        return next(
            (
                str(r.get("service_account"))
                for r in callout_log(stack)
                if r.get("message") == "auth callout: admitted"
                and r.get("identity") == f"device-plugin@{REAL_NODE}"
            ),
            "",
        )

    account = stack.wait_for("the callout to admit the device plugin", admitted, timeout=60)
    assert account == f"{DRIVER_NAMESPACE}/neuron-dra-device-plugin"
    daemonset = stack.get_json("daemonset", "-n", DRIVER_NAMESPACE, realdeviceplugin.DAEMONSET)
    [container] = daemonset["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NEURON_DRA_NATS_TOKEN_FILE"] == "/var/run/secrets/neuron-dra/bus/token"


def test_the_node_shows_the_plugins_resources(stack: KubeStack) -> None:
    expected = served(16, 4)
    stack.wait_for(
        "the Neuron resources in the real node's allocatable",
        lambda: neuron_resources(stack, REAL_NODE, "allocatable") == expected,
        timeout=60,
    )
    assert neuron_resources(stack, REAL_NODE, "capacity") == expected


def _slices() -> list[str]:
    return ["resourceslices", "--field-selector", "spec.driver=neuron.aws.com"]


def test_no_node_is_served_by_both(stack: KubeStack) -> None:
    owners = stack.wait_for(
        f"{DRA_NODE}'s ResourceSlice",
        lambda: {s["spec"].get("nodeName") for s in stack.get_json(*_slices())["items"]},
        timeout=60,
    )
    assert owners == {DRA_NODE}
    assert neuron_resources(stack, DRA_NODE, "allocatable") == {}
    assert neuron_resources(stack, DRA_NODE, "capacity") == {}


def test_a_pod_asking_four_devices_runs_on_the_real_node_with_one_torus_row(
    stack: KubeStack, base: str
) -> None:
    stack.kubectl("apply", "-f", "-", input=neuron_pod("four", image=base, count=4))
    log = report(stack, "four")
    pod = stack.get_json("pod", "four", "-n", NAMESPACE)
    assert pod["spec"]["nodeName"] == REAL_NODE
    assert pod["status"]["phase"] == "Running"
    devices = devices_in(log)
    assert len(devices) == 4
    assert is_connected_set(INSTANCE, devices), devices
    # One row of the 4x4 torus.
    assert devices == list(range(devices[0], devices[0] + 4)), devices
    assert devices[0] % 4 == 0, devices
    assert log.splitlines()[0] == "NEURON_RT_VISIBLE_CORES=" + visible_cores(
        devices, CORES_PER_DEVICE
    )
    # The extender chose the set and bound the pod; the plugin served what it chose.
    annotations = pod["metadata"]["annotations"]
    assert annotations["AWS_NEURON_IDS"] == ",".join(map(str, devices))
    assert annotations["aws.amazon.com/predicate-node"] == REAL_NODE
    assert annotations["NEURON_ALLOCATED"] == "true"
    allocated = [
        json.loads(line) for line in plugin_log(stack).splitlines() if '"allocated"' in line
    ]
    assert [(a["units"], a["visible_cores"]) for a in allocated][-1:] == [
        (devices, visible_cores(devices, CORES_PER_DEVICE))
    ]


def test_a_pod_asking_seven_devices_stays_pending_with_the_reason(
    stack: KubeStack, base: str
) -> None:
    stack.kubectl("apply", "-f", "-", input=neuron_pod("seven", image=base, count=7))
    refusal = str(InvalidDeviceCount(INSTANCE, 7))

    def condition() -> str:
        pod = stack.get_json("pod", "seven", "-n", NAMESPACE)
        found = [c for c in pod["status"].get("conditions", []) if c["type"] == "PodScheduled"]
        return str(found[0].get("message", "")) if found and found[0]["status"] == "False" else ""

    message = stack.wait_for("seven refused by the scheduler", condition, timeout=60)
    assert refusal in message
    events = stack.get_json(
        "events", "-n", NAMESPACE, "--field-selector", "involvedObject.name=seven"
    )["items"]
    assert any(e["reason"] == "FailedScheduling" and refusal in e["message"] for e in events)
    pod = stack.get_json("pod", "seven", "-n", NAMESPACE)
    assert pod["status"]["phase"] == "Pending"
    assert "nodeName" not in pod["spec"]


def test_a_resource_claim_workload_runs_on_the_dra_node(stack: KubeStack) -> None:
    """AWS's DRA guide's 1x4 example, applied as a user applies it."""
    namespace = "dra-workload"
    stack.create_namespace(namespace)
    stack.kubectl("apply", "-n", namespace, "-f", str(GUIDE_1X4))

    def phase() -> str:
        return str(stack.get_json("pod", "pod0", "-n", namespace)["status"].get("phase", ""))

    stack.wait_for("pod0 Running", lambda: phase() == "Running", timeout=120)
    pod = stack.get_json("pod", "pod0", "-n", namespace)
    assert pod["spec"]["nodeName"] == DRA_NODE
    claim = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    results: list[dict[str, Any]] = stack.get_json("resourceclaim", claim, "-n", namespace)[
        "status"
    ]["allocation"]["devices"]["results"]
    assert {r["pool"] for r in results} == {DRA_NODE}
    assert len(results) == 4


def test_a_device_the_node_loses_leaves_allocatable(stack: KubeStack) -> None:
    hardware = realdriver.hardware_root(Layout(stack.state_dir), REAL_NODE)
    shutil.rmtree(NodePaths(hardware).device(15))
    stack.wait_for(
        "device 15 out of the node's allocatable",
        lambda: neuron_resources(stack, REAL_NODE, "allocatable") == served(15, 4),
        timeout=90,
    )
    # Capacity still counts it: the device is there, only unusable.
    assert neuron_resources(stack, REAL_NODE, "capacity")[NEURON] == "16"


def publish(stack: KubeStack, event: DeviceHealthChanged) -> None:
    """Publish ``event`` as the health monitor does when a device fails or is repaired."""

    files = busauth.BusAuth(stack.state_dir / "bus-auth")

    async def send() -> None:
        # The bus is authenticated: the test publishes as its admin, over TLS.
        bus = await Bus.connect(
            [stack.nats_url],
            name="device-plugin-test",
            credentials=BusCredentials(
                token_file=str(files.token(busauth.ADMIN)), tls_ca=str(files.tls_ca)
            ),
        )
        try:
            await bus.publisher(source="/test").publish(event)
        finally:
            await bus.close()

    asyncio.run(send())


def test_a_device_the_health_monitor_reports_unhealthy_leaves_allocatable_until_repaired(
    stack: KubeStack,
) -> None:
    def neurons() -> str:
        return neuron_resources(stack, REAL_NODE, "allocatable")[NEURON]

    before = int(neurons())
    publish(
        stack,
        DeviceHealthChanged(
            node=REAL_NODE, device="neurondevice13", health="Unhealthy", severity="uncorrectable"
        ),
    )
    stack.wait_for("device 13 out of allocatable", lambda: neurons() == str(before - 1), timeout=90)
    assert neuron_resources(stack, REAL_NODE, "allocatable")["aws.amazon.com/neuroncore"] == str(
        (before - 1) * CORES_PER_DEVICE
    )
    publish(stack, DeviceHealthChanged(node=REAL_NODE, device="neurondevice13", health="Healthy"))
    stack.wait_for("device 13 back", lambda: neurons() == str(before), timeout=90)
