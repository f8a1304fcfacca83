"""Read access is enough: ``kubectl neuron explain`` run with a kubeconfig whose user is a
ServiceAccount bound to nothing but the shipped ClusterRole ``neuron-dra-explain-reader``
(token from ``kubectl create token``), as a cluster admin would hand it to a user."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.explain.scenarios import INF, TRN2, claim_spec, request
from tests.fixtures.stack import REPO, KubeStack

pytestmark = pytest.mark.stack

NS = "explain-readonly"
READER_ROLE = REPO / "deploy" / "kustomize" / "components" / "explain" / "rbac.yaml"
DEVICE_CLASS = REPO / "deploy" / "kustomize" / "base" / "core" / "deviceclass.yaml"


def kubeconfig_for(stack: KubeStack, account: str, path: Path) -> Path:
    """A kubeconfig for the stack's apiserver whose only credential is ``account``'s token."""
    token = stack.kubectl("create", "token", account, "-n", NS, "--duration=10m").stdout.strip()
    admin = json.loads(stack.kubectl("config", "view", "--raw", "--minify", "-o", "json").stdout)
    cluster = admin["clusters"][0]
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [cluster],
                "users": [{"name": account, "user": {"token": token}}],
                "contexts": [
                    {
                        "name": account,
                        "context": {"cluster": cluster["name"], "user": account, "namespace": NS},
                    }
                ],
                "current-context": account,
            }
        )
    )
    return path


def kubectl_as(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """kubectl as the user runs it: the plugin ``kubectl-neuron`` found on PATH."""
    bindir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    env["KUBECONFIG"] = str(kubeconfig)
    return subprocess.run(
        [str(bindir / "kubectl"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.fixture(scope="module")
def pending(kube_stack: KubeStack) -> Iterator[KubeStack]:
    """A pod that asks for trn2 devices on the inf2 node only: Pending, RequestSelector."""
    stack = kube_stack
    stack.kubectl("apply", "-f", str(DEVICE_CLASS))
    stack.create_namespace(NS)
    stack.kubectl("apply", "-f", str(READER_ROLE))
    for account in ("reader", "nobody"):
        stack.kubectl("create", "serviceaccount", account, "-n", NS)
    stack.kubectl(
        "create",
        "clusterrolebinding",
        "explain-readonly-reader",
        "--clusterrole=neuron-dra-explain-reader",
        f"--serviceaccount={NS}:reader",
    )
    objs = [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "trn2-device"},
            "spec": {"spec": claim_spec(request(selectors=(TRN2,)))},
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p"},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": INF},
                "containers": [
                    {
                        "name": "main",
                        "image": "busybox",
                        "resources": {"claims": [{"name": "n"}]},
                    }
                ],
                "resourceClaims": [{"name": "n", "resourceClaimTemplateName": "trn2-device"}],
            },
        },
    ]
    stack.kubectl(
        "apply",
        "-n",
        NS,
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}),
    )
    stack.wait_for(
        "pod p to be Unschedulable",
        lambda: any(
            c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
            for c in stack.get_json("pod", "p", "-n", NS).get("status", {}).get("conditions", [])
        ),
    )
    try:
        yield stack
    finally:
        stack.kubectl("delete", "pods", "--all", "-n", NS, "--force", "--grace-period=0")
        stack.kubectl("delete", "clusterrolebinding", "explain-readonly-reader", check=False)
        stack.kubectl("delete", "namespace", NS, "--wait=false", check=False)


def test_reader_role_is_enough_for_kubectl_neuron_explain(
    pending: KubeStack, tmp_path: Path
) -> None:
    config = kubeconfig_for(pending, "reader", tmp_path / "reader.kubeconfig")
    # The role grants no write verb: this user can read pods but not delete one.
    assert kubectl_as(config, "auth", "can-i", "list", "resourceslices.resource.k8s.io").stdout == (
        "yes\n"
    )
    assert kubectl_as(config, "auth", "can-i", "delete", "pods").stdout == "no\n"

    text = kubectl_as(config, "neuron", "explain", "pod/p")
    assert text.returncode == 0, text.stderr
    assert INF in text.stdout
    assert "RequestSelector" in text.stdout

    as_json = kubectl_as(config, "neuron", "explain", "pod/p", "-n", NS, "-o", "json")
    assert as_json.returncode == 0, as_json.stderr
    doc = json.loads(as_json.stdout)
    assert doc["target"] == {"kind": "Pod", "namespace": NS, "name": "p"}
    assert doc["summary"]["schedulable"] is False
    assert doc["nodes"][INF]["verdict"] == "does-not-fit"


def test_without_the_role_explain_says_what_is_not_allowed(
    pending: KubeStack, tmp_path: Path
) -> None:
    config = kubeconfig_for(pending, "nobody", tmp_path / "nobody.kubeconfig")
    proc = kubectl_as(config, "neuron", "explain", "pod/p")
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "neuron-dra-explain-reader" in lines[0] or "forbidden" in lines[0].lower(), lines
