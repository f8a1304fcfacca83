"""Every neuron-dra service on the local stack runs as its own ServiceAccount with the
manifests' RBAC, and the admission policies hold whatever RBAC grants. Checked as an
administrator checks a cluster: ``kubectl auth can-i --as``, ``kubectl auth whoami``, and
writes that must be refused."""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures.stack import KubeStack

pytestmark = pytest.mark.stack

NS = "neuron-dra-driver"


def sa(name: str, namespace: str = NS) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


PUBLISHER = "neuron-dra-slice-publisher"
OPERATOR = "neuron-dra-ultraserver-operator"
PLUGIN = "neuron-dra-kubelet-plugin"
ALLOCATOR = "neuron-dra-topology-allocator"
DISCOVERY = "neuron-dra-discovery"
PROBE = "neuron-dra-health-probe"
AUDIT = "neuron-dra-audit"
ALERTS = "neuron-dra-alerts"

#: (account, verb, resource, namespace or "" for cluster-wide, allowed)
MATRIX = [
    (PUBLISHER, "create", "resourceslices.resource.k8s.io", "", True),
    (PUBLISHER, "delete", "resourceslices.resource.k8s.io", "", True),
    (PUBLISHER, "watch", "nodes", "", True),
    (PUBLISHER, "patch", "nodes", "", False),
    (PUBLISHER, "update", "leases.coordination.k8s.io/neuron-dra-slice-publisher", NS, True),
    (PUBLISHER, "update", "leases.coordination.k8s.io/neuron-dra-slice-publisher-1-of-2", NS, True),
    (PUBLISHER, "update", "leases.coordination.k8s.io/neuron-dra-ultraserver-operator", NS, False),
    (
        PUBLISHER,
        "update",
        "leases.coordination.k8s.io/neuron-dra-slice-publisher",
        "default",
        False,
    ),
    (PUBLISHER, "create", "pods", "default", False),
    (PUBLISHER, "get", "secrets", NS, False),
    (OPERATOR, "get", "nodes", "", True),
    (OPERATOR, "patch", "nodes", "", True),
    (OPERATOR, "update", "nodes", "", False),
    (OPERATOR, "create", "resourceslices.resource.k8s.io", "", False),
    (OPERATOR, "create", "resourceclaimtemplates.resource.k8s.io", "default", True),
    (OPERATOR, "delete", "pods", "default", True),
    (OPERATOR, "create", "pods", "default", False),
    (OPERATOR, "patch", "neuronultraserverworkloads.neuron.aws.com", "default", True),
    (OPERATOR, "create", "neuronultraservers.neuron.aws.com", NS, True),
    (OPERATOR, "create", "neuronultraservers.neuron.aws.com", "default", False),
    (OPERATOR, "get", "secrets", NS, False),
    (OPERATOR, "create", "clusterrolebindings.rbac.authorization.k8s.io", "", False),
    (PLUGIN, "get", "resourceclaims.resource.k8s.io", "default", True),
    (PLUGIN, "list", "resourceclaims.resource.k8s.io", "default", False),
    (PLUGIN, "watch", "resourceclaims.resource.k8s.io", "", False),
    (PLUGIN, "create", "events", "default", True),
    (PLUGIN, "update", "resourceslices.resource.k8s.io", "", False),
    (PLUGIN, "patch", "nodes", "", False),
    (ALLOCATOR, "list", "nodes", "", False),
    (ALLOCATOR, "get", "pods", NS, False),
    (DISCOVERY, "list", "nodes", "", False),
    (DISCOVERY, "get", "configmaps", NS, False),
    (PROBE, "get", "nodes", "", True),
    (PROBE, "patch", "nodes", "", False),
    (PROBE, "list", "pods", "", False),
    (AUDIT, "list", "nodes", "", False),
    (ALERTS, "get", "configmaps", NS, False),
]


@pytest.mark.parametrize(("account", "verb", "resource", "namespace", "allowed"), MATRIX)
def test_who_may_do_what(
    kube_stack: KubeStack, account: str, verb: str, resource: str, namespace: str, allowed: bool
) -> None:
    scope = ["-n", namespace] if namespace else ["--all-namespaces"]
    proc = kube_stack.kubectl(
        "auth", "can-i", verb, resource, *scope, f"--as={sa(account)}", check=False
    )
    assert proc.stdout.strip() == ("yes" if allowed else "no"), (account, verb, resource)


def _component_kubeconfig(stack: KubeStack, kind: str) -> Path:
    """The kubeconfig the running process of ``kind`` was started with: its environment as
    the stack recorded it (a service the agent zygote forked shows the zygote's in
    /proc/<pid>/environ, which is the environment a process was exec'd with)."""
    state = json.loads((stack.state_dir / "state.json").read_text())
    env = next(c["env"] for c in state["components"] if c["kind"] == kind)
    return Path(env["NEURON_DRA_KUBECONFIG"])


def _as_service(stack: KubeStack, kind: str, *args: str) -> subprocess.CompletedProcess[str]:
    own = _component_kubeconfig(stack, kind)
    assert own != stack.kubeconfig
    return subprocess.run(
        [str(Path(sys.executable).parent / "kubectl"), f"--kubeconfig={own}", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("kind", "account"),
    [
        ("slice-publisher", PUBLISHER),
        ("ultraserver-operator", OPERATOR),
        ("kubelet-plugin", PLUGIN),
        ("health-probe", PROBE),
        ("failure-detector", "neuron-dra-failure-detector"),
    ],
)
def test_each_running_service_is_its_own_service_account(
    kube_stack: KubeStack, kind: str, account: str
) -> None:
    proc = _as_service(kube_stack, kind, "auth", "whoami", "-o", "json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["status"]["userInfo"]["username"] == sa(account)


def test_a_forbidden_write_of_each_service_is_refused(kube_stack: KubeStack) -> None:
    node = kube_stack.kubectl(
        "get", "nodes", "-o", "jsonpath={.items[0].metadata.name}"
    ).stdout.strip()
    refused = {
        "slice-publisher": ("label", "node", node, "example.com/x=y"),
        "ultraserver-operator": ("create", "configmap", "x", "-n", "default"),
        "kubelet-plugin": ("delete", "resourceslices", "--all"),
    }
    for kind, args in refused.items():
        proc = _as_service(kube_stack, kind, *args)
        assert proc.returncode != 0, kind
        assert "forbidden" in proc.stderr.lower(), (kind, proc.stderr)


def _slice(name: str, driver: str, node: str) -> str:
    return textwrap.dedent(
        f"""\
        apiVersion: resource.k8s.io/v1
        kind: ResourceSlice
        metadata:
          name: {name}
        spec:
          driver: {driver}
          nodeName: {node}
          pool: {{name: {node}, generation: 1, resourceSliceCount: 1}}
          devices: [{{name: dev0}}]
        """
    )


def test_only_the_slice_publisher_writes_the_drivers_slices(kube_stack: KubeStack) -> None:
    # Someone RBAC allows to write every ResourceSlice is still refused ours by the policy.
    intruder = sa("slice-writer", "default")
    rbac = textwrap.dedent(
        """\
        apiVersion: rbac.authorization.k8s.io/v1
        kind: ClusterRole
        metadata: {name: test-slice-writer}
        rules:
          - apiGroups: [resource.k8s.io]
            resources: [resourceslices]
            verbs: [create, update, delete, get, list]
        ---
        apiVersion: rbac.authorization.k8s.io/v1
        kind: ClusterRoleBinding
        metadata: {name: test-slice-writer}
        roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: test-slice-writer}
        subjects: [{kind: ServiceAccount, name: slice-writer, namespace: default}]
        """
    )
    kube_stack.kubectl("apply", "-f", "-", input=rbac)
    node = kube_stack.kubectl(
        "get", "nodes", "-o", "jsonpath={.items[0].metadata.name}"
    ).stdout.strip()
    ours = kube_stack.kubectl(
        "create", "--dry-run=server", f"--as={intruder}", "-f", "-",
        input=_slice("forged", "neuron.aws.com", node), check=False,
    )  # fmt: skip
    assert ours.returncode != 0
    assert "written only by the neuron-dra slice publisher" in ours.stderr
    assert intruder in ours.stderr
    # The same user may write another driver's slice: the policy is about ours only.
    other = kube_stack.kubectl(
        "create", "--dry-run=server", f"--as={intruder}", "-f", "-",
        input=_slice("other", "gpu.example.com", node), check=False,
    )  # fmt: skip
    assert other.returncode == 0, other.stderr
    # Nor may it delete one of ours.
    [published] = kube_stack.kubectl(
        "get", "resourceslices", "--field-selector", "spec.driver=neuron.aws.com",
        "-o", "jsonpath={.items[0].metadata.name}",
    ).stdout.split()[:1]  # fmt: skip
    gone = kube_stack.kubectl(
        "delete", "resourceslice", published, "--dry-run=server", f"--as={intruder}",
        check=False,
    )  # fmt: skip
    assert gone.returncode != 0
    assert "written only by the neuron-dra slice publisher" in gone.stderr


def _patch_as(kubeconfig: Path, path: str, body: Any) -> tuple[int, str]:
    """A merge patch (dry run) with ``kubeconfig``'s token, as the service itself sends it."""
    config = yaml.safe_load(kubeconfig.read_text())
    cluster = config["clusters"][0]["cluster"]
    token = Path(config["users"][0]["user"]["tokenFile"]).read_text().strip()
    request = urllib.request.Request(
        f"{cluster['server']}{path}?dryRun=All",
        data=json.dumps(body).encode(),
        method="PATCH",
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/merge-patch+json",
        },
    )
    tls = ssl.create_default_context(cafile=cluster["certificate-authority"])
    try:
        with urllib.request.urlopen(request, context=tls, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_operator_changes_only_its_own_keys_on_nodes(kube_stack: KubeStack) -> None:
    # Merge patches with the running operator's own token, as it writes its node records
    # (it may not even GET a Node, so kubectl's patch cannot stand in for it).
    node = kube_stack.kubectl(
        "get", "nodes", "-o", "jsonpath={.items[0].metadata.name}"
    ).stdout.strip()
    operator = _component_kubeconfig(kube_stack, "ultraserver-operator")

    def patch(body: Any) -> tuple[int, str]:
        return _patch_as(operator, f"/api/v1/nodes/{node}", body)

    status, text = patch({"metadata": {"annotations": {"neuron.aws.com/test": "1"}}})
    assert status == 200, text
    status, text = patch({"metadata": {"labels": {"neuron.aws.com/test": "1"}}})
    assert status == 200, text
    for body, says in (
        ({"metadata": {"labels": {"example.com/x": "y"}}}, "only neuron.aws.com/ labels"),
        (
            {"metadata": {"labels": {"node.kubernetes.io/instance-type": None}}},
            "only neuron.aws.com/ labels",
        ),
        ({"metadata": {"annotations": {"example.com/x": "y"}}}, "only neuron.aws.com/ annotations"),
        (
            {"spec": {"taints": [{"key": "example.com/x", "effect": "NoSchedule"}]}},
            "may not change a Node's spec",
        ),
        ({"spec": {"unschedulable": True}}, "may not change a Node's spec"),
    ):
        status, text = patch(body)
        assert status == 403, (body, text)
        assert says in text, (body, text)


def _claim_object(kind: str, name: str, *, uid: str | None) -> str:
    """A ResourceClaim or ResourceClaimTemplate (JSON), labelled with a workload binding
    when ``uid`` is given."""
    spec: dict[str, Any] = {"devices": {"requests": []}}
    metadata: dict[str, Any] = {"name": name, "namespace": "default"}
    if uid is not None:
        metadata["labels"] = {
            "neuron.aws.com/workload": "victim",
            "neuron.aws.com/workload-uid": uid,
        }
    body = {"spec": spec} if kind == "ResourceClaimTemplate" else spec
    return json.dumps(
        {"apiVersion": "resource.k8s.io/v1", "kind": kind, "metadata": metadata, "spec": body}
    )


def test_only_the_operator_and_the_claim_controller_write_the_workload_binding(
    kube_stack: KubeStack,
) -> None:
    # The plugin gives an UltraServer node's devices to claims carrying the workload's UID
    # label; a user whom RBAC lets write claims and templates cannot forge that label.
    user = sa("claim-writer", "default")
    rbac = textwrap.dedent(
        """\
        apiVersion: rbac.authorization.k8s.io/v1
        kind: Role
        metadata: {name: test-claim-writer, namespace: default}
        rules:
          - apiGroups: [resource.k8s.io]
            resources: [resourceclaims, resourceclaimtemplates]
            verbs: [create, update, patch, get, list]
        ---
        apiVersion: rbac.authorization.k8s.io/v1
        kind: RoleBinding
        metadata: {name: test-claim-writer, namespace: default}
        roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: test-claim-writer}
        subjects: [{kind: ServiceAccount, name: claim-writer, namespace: default}]
        """
    )
    kube_stack.kubectl("apply", "-f", "-", input=rbac)

    def create(kind: str, name: str, uid: str | None) -> subprocess.CompletedProcess[str]:
        return kube_stack.kubectl(
            "create", "--dry-run=server", f"--as={user}", "-f", "-",
            input=_claim_object(kind, name, uid=uid), check=False,
        )  # fmt: skip

    victim = "0b3c7a52-0000-4000-8000-000000000001"
    forged = create("ResourceClaim", "forged-claim", victim)
    assert forged.returncode != 0
    assert "are created only from the workload's ResourceClaimTemplate for a pod" in forged.stderr
    assert user in forged.stderr
    template = create("ResourceClaimTemplate", "forged-template", victim)
    assert template.returncode != 0
    assert "written only by the neuron-dra UltraServer operator" in template.stderr
    # The same user's claims without the binding are not the policy's business.
    for kind in ("ResourceClaim", "ResourceClaimTemplate"):
        plain = create(kind, "plain", None)
        assert plain.returncode == 0, plain.stderr
    # A labelled claim (made here by an administrator, whom the policy leaves alone): the user
    # may annotate it, but not move it to another workload or drop the binding.
    kube_stack.kubectl(
        "apply", "-f", "-", input=_claim_object("ResourceClaim", "bound-claim", uid=victim)
    )
    try:

        def as_user(verb: str, *changes: str) -> subprocess.CompletedProcess[str]:
            return kube_stack.kubectl(
                verb, "resourceclaim", "bound-claim", *changes, "--dry-run=server",
                f"--as={user}", check=False,
            )  # fmt: skip

        noted = as_user("annotate", "example.com/note=x")
        assert noted.returncode == 0, noted.stderr
        for change in ("neuron.aws.com/workload-uid=mine", "neuron.aws.com/workload-uid-"):
            moved = as_user("label", change, "--overwrite")
            assert moved.returncode != 0, change
            assert "cannot be added, changed or removed" in moved.stderr, moved.stderr
    finally:
        kube_stack.kubectl("delete", "resourceclaim", "bound-claim", "--ignore-not-found")
