"""A real node runs a user's pod as a real container, and `dev down` leaves nothing of it.

Nothing can be pulled there: the pods' images (the local Debian base, the product's own
image) are imported into the real node's containerd with `neuron-dra dev import-image`,
the way a user would.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from neuron_dra_cli.stack import realconfig, realnodes
from neuron_dra_cli.stack.layout import Layout
from neuron_dra_common.driver import package_version

from tests.e2e.realnode.conftest import REAL_NODE, import_base, import_image
from tests.fixtures.stack import KubeStack, neuron_dra

NAMESPACE = "real-node-test"


def _pod(name: str, *, image: str, script: str) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {
                # Placed by the scheduler, like any user's pod, onto the real node only.
                "nodeSelector": {"kubernetes.io/hostname": REAL_NODE},
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "main",
                        "image": image,
                        "imagePullPolicy": "Never",
                        "command": ["python3", "-c", script],
                    }
                ],
            },
        }
    )


@pytest.fixture(scope="module")
def base_image(real_stack: KubeStack) -> str:
    """The local Debian base, imported into the real node's containerd."""
    return import_base(real_stack, namespace=NAMESPACE)


def test_the_real_node_is_ready_with_containerd(real_stack: KubeStack) -> None:
    node = real_stack.get_json("node", REAL_NODE)
    info = node["status"]["nodeInfo"]
    assert info["containerRuntimeVersion"] == "containerd://2.4.2"
    assert info["kubeletVersion"] == f"v{real_stack.k8s_version}"
    assert node["metadata"]["labels"][realconfig.REAL_NODE_LABEL] == "true"
    ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"]
    assert ready == "True"
    assert [a["type"] for a in node["status"]["addresses"]].count("InternalIP") == 1
    # The simulated node is still there beside it, with its fake runtime.
    names = real_stack.kubectl("get", "nodes", "-o", "name").stdout.split()
    assert sorted(names) == ["node/bare-trn2-0", f"node/{REAL_NODE}"]


def test_a_pod_runs_on_the_real_node_and_its_logs_are_readable(
    real_stack: KubeStack, base_image: str
) -> None:
    script = (
        "import pathlib, socket, time\n"
        "os_name = pathlib.Path('/etc/os-release').read_text().splitlines()[0]\n"
        "print('hello from', socket.gethostname(), os_name, flush=True)\n"
        "time.sleep(600)\n"
    )
    real_stack.kubectl("apply", "-f", "-", input=_pod("hello", image=base_image, script=script))

    def phase() -> str:
        pod = real_stack.get_json("pod", "hello", "-n", NAMESPACE)
        return str(pod["status"].get("phase", ""))

    real_stack.wait_for("pod hello Running", lambda: phase() == "Running", timeout=120)
    pod = real_stack.get_json("pod", "hello", "-n", NAMESPACE)
    assert pod["spec"]["nodeName"] == REAL_NODE
    assert pod["status"]["podIP"].startswith("10.")
    logs = real_stack.wait_for(
        "the pod's log line",
        lambda: real_stack.kubectl("logs", "hello", "-n", NAMESPACE).stdout,
        timeout=30,
    )
    # The container's own hostname is the pod's name, and its files are Debian's.
    assert logs == 'hello from hello PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\n'
    out = real_stack.kubectl("exec", "hello", "-n", NAMESPACE, "--", "cat", "/proc/1/cmdline")
    assert out.stdout.split("\0")[:2] == ["python3", "-c"]


def test_a_pod_that_exits_succeeds_with_its_output(real_stack: KubeStack, base_image: str) -> None:
    script = "print('done', 6 * 7)"
    real_stack.kubectl("apply", "-f", "-", input=_pod("once", image=base_image, script=script))

    def phase() -> str:
        pod = real_stack.get_json("pod", "once", "-n", NAMESPACE)
        return str(pod["status"].get("phase", ""))

    real_stack.wait_for("pod once Succeeded", lambda: phase() == "Succeeded", timeout=120)
    assert real_stack.kubectl("logs", "once", "-n", NAMESPACE).stdout == "done 42\n"


def test_the_products_image_runs_on_the_real_node(
    real_stack: KubeStack, base_image: str, image: str
) -> None:
    """``image``: this checkout's image (tests/fixtures/image.py), as deploy/ runs it."""
    import_image(real_stack, image)
    pod = json.loads(_pod("product", image=image, script=""))
    pod["spec"]["containers"][0]["command"] = ["neuron-dra", "--version"]
    real_stack.kubectl("apply", "-f", "-", input=json.dumps(pod))

    def phase() -> str:
        got = real_stack.get_json("pod", "product", "-n", NAMESPACE)
        return str(got["status"].get("phase", ""))

    real_stack.wait_for("pod product Succeeded", lambda: phase() == "Succeeded", timeout=120)
    version = real_stack.kubectl("logs", "product", "-n", NAMESPACE).stdout
    assert version == f"neuron-dra {package_version('neuron-dra-cli')}\n"


def test_import_image_names_a_node_that_is_not_real(real_stack: KubeStack) -> None:
    proc = neuron_dra(
        "dev", "import-image", "localhost/x:1", "--node", "bare-trn2-0",
        "--state-dir", str(real_stack.state_dir),
    )  # fmt: skip
    assert proc.returncode != 0
    assert "bare-trn2-0: not a running real node of the stack under " in proc.stderr
    assert f"(real nodes: {REAL_NODE})" in proc.stderr


def test_dev_status_lists_the_real_node(real_stack: KubeStack) -> None:
    proc = neuron_dra("dev", "status", "--state-dir", str(real_stack.state_dir), "-o", "json")
    report = json.loads(proc.stdout)
    up = {c["name"]: c["up"] for c in report["components"]}
    assert up[f"kubelet-{REAL_NODE}"] is True
    assert up[f"containerd-{REAL_NODE}"] is True
    assert report["kinds"]["real-node"]["up"] == 1


def _shims_of(socket: Path) -> list[int]:
    found = []
    for pid_dir in Path("/proc").iterdir():
        try:
            argv = (pid_dir / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"containerd-shim-runc-v2") and str(socket).encode() in argv:
            found.append(int(pid_dir.name))
    return found


def test_dev_down_leaves_no_container_mount_or_bridge(
    real_stack: KubeStack, base_image: str
) -> None:
    """Last in this module: it stops the stack (the fixture's own stop then finds none)."""
    paths = realnodes.node_paths(Layout(real_stack.state_dir), REAL_NODE)
    socket, base = paths.socket, paths.base.resolve()
    bridge = realconfig.network(stack_id=str(real_stack.state_dir), index=0).bridge
    assert _shims_of(socket), "the running pod has no shim: nothing to check the clean-up on"
    assert str(base) in Path("/proc/self/mountinfo").read_text()

    proc = neuron_dra("dev", "down", "--state-dir", str(real_stack.state_dir), timeout=120)
    assert proc.returncode == 0, proc.stderr

    assert _shims_of(socket) == []
    assert str(base) not in Path("/proc/self/mountinfo").read_text()
    link = subprocess.run(["ip", "link", "show", bridge], capture_output=True, check=False)
    assert link.returncode != 0, f"bridge {bridge} is still there"
    assert not base.exists()
    logs = Path("/var/log/containers")
    if logs.is_dir():
        ours = (str(paths.base), str(base))
        assert not [p for p in logs.iterdir() if os.readlink(p).startswith(ours)]
