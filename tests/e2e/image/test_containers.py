"""Every service's container, run by a real engine against the local stack's NATS and
apiserver: it starts, answers its health endpoint, does its work, and exits 0 on SIGTERM.

The node agents (discovery, kubelet plugin) serve the node the stack runs no agents for,
with its simulated hardware mounted where the DaemonSets mount the host's; the kubelet
plugin runs as root, as its DaemonSet does, and registers with that node's kubelet. The
slice publisher takes over from the stack's own and writes that node's ResourceSlices.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from neuron_dra_cli.stack.layout import Layout
from neuron_dra_cli.stack.nodes import kubelet_root
from neuron_dra_cli.stack.process import free_port
from neuron_dra_common.hardware.simulate import write_node

from tests.e2e.image.conftest import CONTAINER_NODE, stop_stack_component
from tests.fixtures.image import Container, portable_kubeconfig, run_container
from tests.fixtures.stack import KubeStack

pytestmark = [pytest.mark.stack, pytest.mark.image, pytest.mark.timeout(900)]


def stopped_cleanly(container: Container) -> None:
    code = container.terminate()
    log = container.logs()
    assert code == 0, f"{container.name} exited {code} on SIGTERM:\n{log[-4000:]}"
    assert "Traceback" not in log, log[-4000:]


def test_topology_allocator(image: str, image_stack: KubeStack) -> None:
    c = run_container(
        image,
        ["neuron-dra-topology-allocator"],
        env=image_stack.service_env(),
    )
    try:
        c.wait_http("/healthz")
        c.wait_http("/readyz")
        assert c.get("/metrics") == 200
        stopped_cleanly(c)
    finally:
        c.remove()


def test_ultraserver_operator(image: str, image_stack: KubeStack, tmp_path: Path) -> None:
    kubeconfig = portable_kubeconfig(image_stack.kubeconfig, tmp_path / "kubeconfig")
    c = run_container(
        image,
        ["neuron-dra-ultraserver-operator"],
        env={
            **image_stack.service_env(),
            "NEURON_DRA_KUBECONFIG": "/etc/neuron-dra/kubeconfig",
            "NEURON_DRA_IDENTITY": "container",
        },
        volumes=[f"{kubeconfig}:/etc/neuron-dra/kubeconfig:ro"],
    )
    try:
        c.wait_http("/healthz")
        stopped_cleanly(c)
    finally:
        c.remove()


def test_audit_writes_cloudevents_lines(image: str, image_stack: KubeStack, tmp_path: Path) -> None:
    logs = tmp_path / "audit"
    logs.mkdir()
    logs.chmod(0o777)  # the image's user (uid 65532) writes there, as on the pod's emptyDir
    # The stack's audit stops; the container's is then the only reader of its consumer.
    stop_stack_component(image_stack, "audit")
    c = run_container(
        image,
        ["neuron-dra-audit"],
        env=image_stack.service_env(),
        volumes=[f"{logs}:/var/log/neuron-dra"],
    )
    try:
        c.wait_http("/readyz")
        audit = logs / "audit.jsonl"
        image_stack.wait_for(
            "a line in the container's audit file",
            lambda: audit.exists() and audit.read_text().strip() != "",
            timeout=120,
        )
        first = json.loads(audit.read_text().splitlines()[0])
        assert first["specversion"] == "1.0"
        assert first["type"]
        stopped_cleanly(c)
    finally:
        c.remove()


def test_alerts(image: str, image_stack: KubeStack) -> None:
    c = run_container(
        image,
        ["neuron-dra-alerts"],
        env={
            **image_stack.service_env(),
            # Nothing listens there: the service keeps the alerts and sends them later.
            "NEURON_DRA_ALERTMANAGER_URL": f"http://127.0.0.1:{free_port()}",
        },
    )
    try:
        c.wait_http("/healthz")
        stopped_cleanly(c)
    finally:
        c.remove()


def test_node_agents_and_slice_publisher(
    image: str, image_stack: KubeStack, tmp_path: Path
) -> None:
    stack = image_stack
    layout = Layout(stack.state_dir)
    hw = write_node(tmp_path / "hw", instance_type="trn2.48xlarge", node_name=CONTAINER_NODE)
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    # The kubelet root as the kubelet names it (a short alias), mounted at that same path.
    root = kubelet_root(layout, CONTAINER_NODE)
    admin = portable_kubeconfig(stack.kubeconfig, tmp_path / "admin.kubeconfig")
    plugin_cfg = portable_kubeconfig(
        layout.component_kubeconfig("kubelet-plugin"), tmp_path / "plugin.kubeconfig"
    )
    assert not [
        s
        for s in stack.get_json("resourceslices")["items"]
        if s["spec"].get("nodeName") == CONTAINER_NODE
    ]

    # The stack's publisher stops; the container's is then the only one.
    stop_stack_component(stack, "slice-publisher")
    containers: list[Container] = []
    try:
        publisher = run_container(
            image,
            ["neuron-dra-slice-publisher"],
            env={
                **stack.service_env(),
                "NEURON_DRA_KUBECONFIG": "/etc/neuron-dra/kubeconfig",
                "NEURON_DRA_IDENTITY": "container",
                "NEURON_DRA_LEASE_SECONDS": "6",
            },
            volumes=[f"{admin}:/etc/neuron-dra/kubeconfig:ro"],
        )
        containers.append(publisher)
        host = [
            f"{hw.root}/sys:/host/sys:ro",
            f"{hw.root}/dev:/host/dev:ro",
            f"{hw.root}/opt/aws/neuron:/host/opt/aws/neuron:ro",
        ]
        discovery = run_container(
            image,
            ["neuron-dra-discovery"],
            env={
                "NEURON_DRA_NODE_NAME": CONTAINER_NODE,
                "NEURON_DRA_HOST_ROOT": "/host",
                "NEURON_DRA_NEURON_LS_COMMAND": "/host/opt/aws/neuron/bin/neuron-ls,-j",
                **stack.service_env(),
                "NEURON_DRA_POLL_SECONDS": "1",
            },
            volumes=host,
        )
        containers.append(discovery)
        plugin = run_container(
            image,
            ["neuron-dra-kubelet-plugin"],
            user="0",
            env={
                "NEURON_DRA_NODE_NAME": CONTAINER_NODE,
                "NEURON_DRA_KUBELET_ROOT": str(root),
                "NEURON_DRA_CDI_ROOT": "/var/run/cdi",
                "NEURON_DRA_HOST_ROOT": "/host",
                "NEURON_DRA_NEURON_LS_COMMAND": "/host/opt/aws/neuron/bin/neuron-ls,-j",
                "NEURON_DRA_KUBECONFIG": "/etc/neuron-dra/kubeconfig",
                **stack.service_env(),
            },
            volumes=[
                *host,
                f"{root.resolve()}:{root}",
                f"{cdi}:/var/run/cdi",
                f"{plugin_cfg}:/etc/neuron-dra/kubeconfig:ro",
            ],
        )
        containers.append(plugin)
        for c in containers:
            c.wait_http("/healthz")
        # Ready once the node's kubelet has registered it.
        plugin.wait_http("/readyz", timeout=120)
        discovery.wait_http("/readyz")

        def pool() -> list[dict[str, object]]:
            return [
                d
                for s in stack.get_json("resourceslices")["items"]
                if s["spec"].get("nodeName") == CONTAINER_NODE
                and s["spec"]["driver"] == "neuron.aws.com"
                for d in s["spec"].get("devices") or []
            ]

        devices = stack.wait_for(f"{CONTAINER_NODE}'s ResourceSlices", pool, timeout=120)
        names = {str(d["name"]) for d in devices}
        assert {f"neurondevice{i}" for i in range(16)} <= names
        for c in containers:
            stopped_cleanly(c)
    finally:
        for c in containers:
            c.remove()
