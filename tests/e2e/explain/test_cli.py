"""``kubectl neuron explain`` on the local stack, run through the real kubectl as a user runs
it: a Pending pod's reason per node group, ``-o json``, and the errors a user can meet."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.stack import REPO, KubeStack

pytestmark = pytest.mark.stack

EXAMPLE = REPO / "examples" / "explain" / "too-many-neurons.yaml"
BIN = Path(sys.executable).parent


def kubectl_neuron(
    stack: KubeStack, *args: str, kubeconfig: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``kubectl neuron ARGS``: kubectl finds the plugin ``kubectl-neuron`` on PATH and hands
    it the arguments and KUBECONFIG."""
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "KUBECONFIG": str(kubeconfig or stack.kubeconfig),
    }
    return subprocess.run(
        [str(BIN / "kubectl"), "neuron", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.fixture
def ns(kube_stack: KubeStack) -> Iterator[str]:
    name = f"explain-{uuid.uuid4().hex[:8]}"
    kube_stack.create_namespace(name)
    try:
        yield name
    finally:
        kube_stack.kubectl("delete", "namespace", name, "--wait=false", check=False)


def unschedulable(stack: KubeStack, ns: str, name: str) -> dict[str, Any]:
    """The pod once the scheduler has tried it (PodScheduled=False)."""

    def tried() -> dict[str, Any] | None:
        pod: dict[str, Any] = stack.get_json("pod", name, "-n", ns)
        conditions = pod.get("status", {}).get("conditions", [])
        done = any(c["type"] == "PodScheduled" and c["status"] == "False" for c in conditions)
        return pod if done else None

    result: dict[str, Any] = stack.wait_for(f"pod {ns}/{name} unschedulable", tried, timeout=90)
    return result


def nodes_by_kind(stack: KubeStack) -> dict[str, list[str]]:
    kinds: dict[str, list[str]] = {"trn2": [], "inf2": [], "bare": []}
    for node in stack.get_json("nodes")["items"]:
        name = node["metadata"]["name"]
        labels = node["metadata"].get("labels", {})
        if labels.get("neuron.aws.com/driver") == "false":
            kinds["bare"].append(name)
        elif labels.get("node.kubernetes.io/instance-type", "").startswith("inf2"):
            kinds["inf2"].append(name)
        else:
            kinds["trn2"].append(name)
    return kinds


def test_pending_pod_gets_its_reason_per_node_group(kube_stack: KubeStack, ns: str) -> None:
    kube_stack.kubectl("apply", "-n", ns, "-f", str(EXAMPLE))
    unschedulable(kube_stack, ns, "too-many-neurons")
    kinds = nodes_by_kind(kube_stack)

    proc = kubectl_neuron(kube_stack, "explain", "pod/too-many-neurons", "-n", ns)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert text.startswith(f"Pod {ns}/too-many-neurons: no node fits")
    assert "scheduler says: PodScheduled=False Unschedulable" in text
    # One group per reason: trn2 nodes have 16 devices, the inf2 node's fail the selector.
    trn2 = ", ".join(sorted(kinds["trn2"]))
    assert f"does not fit: {len(kinds['trn2'])} nodes ({trn2})" in text
    assert "asks for 32 devices; the node has 16" in text
    assert "RequestSelector: 12 of 12 devices do not pass request neurons" in text
    for bare in kinds["bare"]:
        assert f"does not fit: 1 node ({bare})\n    NoPool:" in text

    data = json.loads(
        kubectl_neuron(kube_stack, "explain", "po/too-many-neurons", "-n", ns, "-o", "json").stdout
    )
    assert data["apiVersion"] == "explain.neuron.aws.com/v1"
    assert data["summary"]["schedulable"] is False
    assert data["summary"]["scheduler"]["podScheduled"] == "False"
    verdicts = {name: entry["verdict"] for name, entry in data["nodes"].items()}
    assert verdicts == {n: "does-not-fit" for names in kinds.values() for n in names}
    first_trn2 = data["groups"][data["nodes"][kinds["trn2"][0]]["group"]]
    assert first_trn2["reasons"][0]["code"] == "NotEnoughDevices"
    assert first_trn2["reasons"][0]["need"] == 32


def test_a_selector_for_a_missing_instance_type(kube_stack: KubeStack, ns: str) -> None:
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "trn1-neurons"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "neurons",
                        "exactly": {
                            "deviceClassName": "neuron.aws.com",
                            "count": 1,
                            "selectors": [
                                {
                                    "cel": {
                                        "expression": "device.attributes['neuron.aws.com']"
                                        ".instanceType == 'trn1.32xlarge'"
                                    }
                                }
                            ],
                        },
                    }
                ]
            }
        },
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "wants-trn1"},
        "spec": {
            "containers": [
                {"name": "c", "image": "busybox", "resources": {"claims": [{"name": "n"}]}}
            ],
            "resourceClaims": [{"name": "n", "resourceClaimName": "trn1-neurons"}],
        },
    }
    body = json.dumps({"apiVersion": "v1", "kind": "List", "items": [claim, pod]})
    kube_stack.kubectl("apply", "-n", ns, "-f", "-", input=body)
    unschedulable(kube_stack, ns, "wants-trn1")

    proc = kubectl_neuron(kube_stack, "explain", "wants-trn1", "-n", ns)
    assert proc.returncode == 0, proc.stderr
    pooled = [n for kind in ("trn2", "inf2") for n in nodes_by_kind(kube_stack)[kind]]
    assert f"does not fit: {len(pooled)} nodes" in proc.stdout
    assert "RequestSelector:" in proc.stdout
    assert "instanceType == 'trn1.32xlarge' is false" in proc.stdout
    claim_view = kubectl_neuron(kube_stack, "explain", "rc/trn1-neurons", "-n", ns, "-o", "json")
    assert json.loads(claim_view.stdout)["target"]["kind"] == "ResourceClaim"


def test_errors_are_one_clear_line(kube_stack: KubeStack, ns: str, tmp_path: Path) -> None:
    missing = kubectl_neuron(kube_stack, "explain", "pod/nope", "-n", ns)
    assert missing.returncode == 2
    assert missing.stderr.strip() == f"kubectl neuron: Pod {ns}/nope not found"

    plain = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "plain"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }
    kube_stack.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(plain))
    not_dra = kubectl_neuron(kube_stack, "explain", "pod/plain", "-n", ns)
    assert not_dra.returncode == 2
    assert "is not a DRA pod: spec.resourceClaims is empty" in not_dra.stderr

    # A kubeconfig whose server nobody listens on: the cluster is unreachable.
    config = kube_stack.kubeconfig.read_text()
    server = next(line.split()[-1] for line in config.splitlines() if "server:" in line)
    closed = tmp_path / "kubeconfig"
    closed.write_text(config.replace(server, "https://127.0.0.1:9"))
    down = kubectl_neuron(kube_stack, "explain", "pod/x", "-n", ns, kubeconfig=closed)
    assert down.returncode == 2
    assert down.stderr.startswith("kubectl neuron: cannot reach the cluster")
    assert len(down.stderr.strip().splitlines()) == 1


def test_help_explains_the_verdicts() -> None:
    proc = subprocess.run(
        [str(BIN / "kubectl-neuron"), "explain", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0
    for word in (
        "fits",
        "does not fit",
        "scheduler error",
        "cannot tell",
        "neuron-dra-explain-reader",
        "-o json",
    ):
        assert word in proc.stdout
