"""The device plugin on a real node: the real kubelet's device manager registers it, the node
shows its Neuron resources, and a pod asking ``aws.amazon.com/neuron: 4`` runs as a real
container with the four connected devices and exactly their cores.

The real node has no Neuron hardware: it gets a simulated trn2.48xlarge (the files discovery
reads), whose ``/dev/neuronN`` are real character devices (major 240, the kernel's
"local/experimental" range; minor N), so containerd can read them and runc can make them in
the container. The plugin runs as a process of the stack (``dev down`` stops it).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from neuron_dra_cli.stack.components import Component, python_service
from neuron_dra_cli.stack.layout import Layout
from neuron_dra_common.bus import Bus
from neuron_dra_common.events import DeviceHealthChanged
from neuron_dra_common.hardware.layout import NodePaths
from neuron_dra_common.hardware.simulate import write_node
from neuron_dra_common.topology import instance_spec, is_connected_set, visible_cores

from tests.e2e.realnode.conftest import REAL_NODE
from tests.e2e.realnode.test_real_node import import_image
from tests.fixtures.processes import start_recorded, wait_gone
from tests.fixtures.stack import KubeStack

NAMESPACE = "device-plugin-test"
PLUGIN = "device-plugin-real-node-0"
INSTANCE = "trn2.48xlarge"
#: The kernel's major number for local/experimental character devices.
MAJOR = 240
CORES_PER_DEVICE = 4  # trn2 at its default logical core config (2)
#: The kubelet's device manager listens on /var/lib/kubelet/device-plugins/kubelet.sock
#: whatever its --root-dir (the path is a constant of the device plugin API), so the real
#: node's kubelet, rooted in the stack's folder, still serves device plugins there.
DEVICE_MANAGER_ROOT = Path("/var/lib/kubelet")

# What the container prints: its visible cores, then each /dev/neuronN with its minor number.
REPORT = (
    "import os, glob\n"
    "print('NEURON_RT_VISIBLE_CORES=' + os.environ.get('NEURON_RT_VISIBLE_CORES', ''))\n"
    "for path in sorted(glob.glob('/dev/neuron*'), key=lambda p: int(p[len('/dev/neuron'):])):\n"
    "    print(path, os.minor(os.stat(path).st_rdev))\n"
)


@pytest.fixture(scope="module")
def hardware() -> Iterator[Path]:
    """A simulated trn2.48xlarge whose device nodes are character devices."""
    with tempfile.TemporaryDirectory(prefix="dp-hw-", dir="/tmp") as root:
        sim = write_node(Path(root), instance_type=INSTANCE, node_name=REAL_NODE)
        paths = NodePaths(sim.root)
        for index in range(instance_spec(INSTANCE).devices):
            node = paths.dev_node(index)
            node.unlink()
            os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(MAJOR, index))
        yield sim.root


@pytest.fixture(scope="module")
def plugin(real_stack: KubeStack, hardware: Path) -> Iterator[tuple[Component, Path]]:
    layout = Layout(real_stack.state_dir)
    component = python_service(
        name=PLUGIN,
        kind=PLUGIN,
        module="neuron_dra_device_plugin",
        env={
            "NEURON_DRA_NODE_NAME": REAL_NODE,
            "NEURON_DRA_HOST_ROOT": str(hardware),
            "NEURON_DRA_NEURON_LS_PATH": str(NodePaths(hardware).neuron_ls_json),
            "NEURON_DRA_KUBELET_ROOT": str(DEVICE_MANAGER_ROOT),
            "NEURON_DRA_KUBECONFIG": str(real_stack.kubeconfig),
            "NEURON_DRA_HEALTH_INTERVAL": "0.5",
            "NEURON_DRA_NATS_SERVERS": real_stack.nats_url,
        },
        ready_path="/readyz",
    )
    log = Path(layout.log(PLUGIN))
    proc = start_recorded(layout, component, log=log)
    try:
        real_stack.wait_for("the device plugin registered", component.ready, timeout=60)
        yield component, log
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        wait_gone(proc.pid)


@pytest.fixture(scope="module")
def base(real_stack: KubeStack) -> str:
    from neuron_dra_cli import imagebuild

    ref = imagebuild.ensure_base(progress=lambda _m: None)
    import_image(real_stack, ref)
    real_stack.create_namespace(NAMESPACE)
    return ref


def neuron_pod(
    name: str, *, image: str, count: int, annotations: dict[str, str] | None = None
) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "annotations": annotations or {}},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": REAL_NODE},
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "main",
                        "image": image,
                        "imagePullPolicy": "Never",
                        "command": ["python3", "-c", REPORT],
                        "resources": {"limits": {"aws.amazon.com/neuron": str(count)}},
                    }
                ],
            },
        }
    )


def run_to_completion(stack: KubeStack, name: str) -> tuple[dict[str, Any], str]:
    """Wait for pod ``name`` to succeed; its object and its log."""

    def phase() -> str:
        pod = stack.get_json("pod", name, "-n", NAMESPACE)
        return str(pod["status"].get("phase", ""))

    stack.wait_for(f"pod {name} Succeeded", lambda: phase() == "Succeeded", timeout=120)
    return (
        stack.get_json("pod", name, "-n", NAMESPACE),
        stack.kubectl("logs", name, "-n", NAMESPACE).stdout,
    )


def devices_in(log: str) -> list[int]:
    """The minor numbers of the container's /dev/neuronN, checked against their names."""
    out = []
    for line in log.splitlines()[1:]:
        path, minor = line.split()
        assert path == f"/dev/neuron{minor}", line
        out.append(int(minor))
    return out


def neuron_resources(stack: KubeStack, part: str) -> dict[str, str]:
    node = stack.get_json("node", REAL_NODE)
    return {
        k: v for k, v in node["status"].get(part, {}).items() if k.startswith("aws.amazon.com/")
    }


def test_the_node_shows_the_plugins_resources(
    real_stack: KubeStack, plugin: tuple[Component, Path]
) -> None:
    expected = {
        "aws.amazon.com/neuron": "16",
        "aws.amazon.com/neurondevice": "16",
        "aws.amazon.com/neuroncore": "64",
    }
    real_stack.wait_for(
        "the Neuron resources in the node's allocatable",
        lambda: neuron_resources(real_stack, "allocatable") == expected,
        timeout=60,
    )
    assert neuron_resources(real_stack, "capacity") == expected


def test_a_pod_asking_four_devices_gets_a_torus_row_and_exactly_its_cores(
    real_stack: KubeStack, plugin: tuple[Component, Path], base: str
) -> None:
    real_stack.kubectl("apply", "-f", "-", input=neuron_pod("four", image=base, count=4))
    pod, log = run_to_completion(real_stack, "four")
    assert pod["spec"]["nodeName"] == REAL_NODE
    devices = devices_in(log)
    assert len(devices) == 4
    assert is_connected_set(INSTANCE, devices), devices
    # On an idle node the plugin prefers the first row.
    assert devices == [0, 1, 2, 3]
    assert log.splitlines()[0] == "NEURON_RT_VISIBLE_CORES=" + visible_cores(
        devices, CORES_PER_DEVICE
    )
    # What the plugin says it allocated is what the container got.
    _, plugin_log = plugin
    allocated = [
        json.loads(line) for line in plugin_log.read_text().splitlines() if '"allocated"' in line
    ]
    assert [(a["units"], a["visible_cores"]) for a in allocated][-1:] == [([0, 1, 2, 3], "0-15")]


def test_a_pod_placed_by_the_scheduler_extension_gets_the_devices_it_was_given(
    real_stack: KubeStack, plugin: tuple[Component, Path], base: str
) -> None:
    # The annotations the scheduler extension writes when it binds a pod.
    annotations = {
        "AWS_NEURON_IDS": "8,9,10,11",
        "NEURON_RESOURCE_TYPE": "aws.amazon.com/neuron",
        "NEURON_ALLOC_TIME": str(time.time_ns()),
        "NEURON_ALLOCATED": "false",
        "aws.amazon.com/predicate-node": REAL_NODE,
    }
    real_stack.kubectl(
        "apply",
        "-f",
        "-",
        input=neuron_pod("placed", image=base, count=4, annotations=annotations),
    )
    pod, log = run_to_completion(real_stack, "placed")
    assert devices_in(log) == [8, 9, 10, 11]
    assert log.splitlines()[0] == "NEURON_RT_VISIBLE_CORES=32-47"
    assert pod["metadata"]["annotations"]["NEURON_ALLOCATED"] == "true"


def test_a_device_the_node_loses_leaves_allocatable(
    real_stack: KubeStack, plugin: tuple[Component, Path], hardware: Path
) -> None:
    shutil.rmtree(NodePaths(hardware).device(15))
    real_stack.wait_for(
        "device 15 out of the node's allocatable",
        lambda: (
            neuron_resources(real_stack, "allocatable")
            == {
                "aws.amazon.com/neuron": "15",
                "aws.amazon.com/neurondevice": "15",
                "aws.amazon.com/neuroncore": "60",
            }
        ),
        timeout=90,
    )
    # Capacity still counts it: the device is there, only unusable.
    assert neuron_resources(real_stack, "capacity")["aws.amazon.com/neuron"] == "16"


def publish(stack: KubeStack, event: DeviceHealthChanged) -> None:
    """Publish ``event`` as the health monitor does when a device fails or is repaired."""

    async def send() -> None:
        bus = await Bus.connect([stack.nats_url], name="device-plugin-test")
        try:
            await bus.publisher(source="/test").publish(event)
        finally:
            await bus.close()

    asyncio.run(send())


def test_a_device_the_health_monitor_reports_unhealthy_leaves_allocatable_until_repaired(
    real_stack: KubeStack, plugin: tuple[Component, Path]
) -> None:
    def neurons() -> str:
        return neuron_resources(real_stack, "allocatable")["aws.amazon.com/neuron"]

    before = int(neurons())
    publish(
        real_stack,
        DeviceHealthChanged(
            node=REAL_NODE, device="neurondevice13", health="Unhealthy", severity="uncorrectable"
        ),
    )
    real_stack.wait_for(
        "device 13 out of allocatable", lambda: neurons() == str(before - 1), timeout=90
    )
    assert neuron_resources(real_stack, "allocatable")["aws.amazon.com/neuroncore"] == str(
        (before - 1) * CORES_PER_DEVICE
    )
    publish(
        real_stack, DeviceHealthChanged(node=REAL_NODE, device="neurondevice13", health="Healthy")
    )
    real_stack.wait_for("device 13 back", lambda: neurons() == str(before), timeout=90)
