"""Each neuron-dra service on the local stack runs with its own ServiceAccount's token.

The ServiceAccounts, roles and bindings are the ones ``deploy/kustomize/base`` installs on a
cluster, applied as they are; each service then gets a token of its account from the
TokenRequest API (``kubectl create token``), kept in a file its kubeconfig names as
``tokenFile``, as a pod's projected token is. So the stack exercises the manifests' RBAC and
admission policies, never admin rights.

A node agent (the health probe, the device plugin) is held to its own node by admission
policies keyed on the node a pod-bound token names (``authentication.kubernetes.io/node-name``,
which the API server takes from the pod's ``spec.nodeName``). On a cluster the kubelet gives
the agent's pod such a token; on the stack, where the agent is a process, each agent gets a
Pod object standing for it, bound to its node (:func:`node_agent_kubeconfigs`), and a token
bound to that Pod. Deleting the Pod revokes the token, as on a cluster.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final

import yaml

from neuron_dra_cli.stack import kubectl
from neuron_dra_cli.stack.layout import Layout

__all__ = [
    "ACCOUNTS",
    "BASE",
    "NAMESPACE",
    "NODE_AGENTS",
    "RBAC_KINDS",
    "apply_accounts",
    "node_agent_kubeconfigs",
    "node_agent_name",
    "node_agent_pod",
    "rbac_objects",
    "service_kubeconfig",
    "service_kubeconfigs",
    "username",
]

REPO: Final = Path(__file__).resolve().parents[5]
BASE: Final = REPO / "deploy" / "kustomize" / "base"
NAMESPACE: Final = "neuron-dra-driver"
RBAC_KINDS: Final = frozenset(
    {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
)

#: The services that call the Kubernetes API, by the stack's component kind, and their
#: ServiceAccount in the base. (Discovery, the topology allocator, audit and alerts call no
#: API.)
ACCOUNTS: Final = {
    "slice-publisher": "neuron-dra-slice-publisher",
    "ultraserver-operator": "neuron-dra-ultraserver-operator",
    "kubelet-plugin": "neuron-dra-kubelet-plugin",
    "health-probe": "neuron-dra-health-probe",
    "failure-detector": "neuron-dra-failure-detector",
    "device-plugin": "neuron-dra-device-plugin",
}
#: The agents that run on each node: a token of theirs is bound to a pod on that node
#: (:func:`node_agent_kubeconfigs`), never a plain one. (The device plugin's account is
#: in ``deploy/kustomize/components/device-plugin``, applied by ``stack.deviceplugin``.)
NODE_AGENTS: Final = frozenset({"health-probe", "device-plugin"})

#: Tokens outlive any local stack; a cluster's kubelet rotates a pod's token instead.
TOKEN_DURATION: Final = "8760h"


def username(account: str) -> str:
    """The user name the API server sees for ``account``'s tokens."""
    return f"system:serviceaccount:{NAMESPACE}:{account}"


def rbac_objects(admin_kubeconfig: Path, tree: Path = BASE) -> list[dict[str, object]]:
    """The ServiceAccounts, roles and bindings of ``tree`` (the base, or the base with the
    bus-auth component), rendered with the stack's kubectl."""
    out = kubectl.run(admin_kubeconfig, ["kustomize", str(tree)]).stdout
    return [d for d in yaml.safe_load_all(out) if d and d.get("kind") in RBAC_KINDS]


def apply_accounts(admin_kubeconfig: Path, tree: Path = BASE) -> None:
    """Apply every service's ServiceAccount and RBAC from ``tree`` (the namespace exists)."""
    docs = rbac_objects(admin_kubeconfig, tree)
    kubectl.run(admin_kubeconfig, ["apply", "-f", "-"], input=yaml.safe_dump_all(docs))


def _server_and_ca(admin_kubeconfig: Path) -> tuple[str, str]:
    config = yaml.safe_load(admin_kubeconfig.read_text())
    cluster = config["clusters"][0]["cluster"]
    return str(cluster["server"]), str(cluster["certificate-authority"])


def service_kubeconfig(
    layout: Layout, admin_kubeconfig: Path, kind: str, *, account: str = "", pod: str = ""
) -> Path:
    """A kubeconfig for the service ``kind`` with a fresh token of its ServiceAccount
    (``account``, or the one :data:`ACCOUNTS` names); with ``pod``, a token bound to that
    Pod (in :data:`NAMESPACE`), kept as the kubeconfig of the component named ``pod``."""
    account = account or ACCOUNTS[kind]
    bound = ["--bound-object-kind=Pod", f"--bound-object-name={pod}"] if pod else []
    token = kubectl.run(
        admin_kubeconfig,
        ["create", "token", account, "-n", NAMESPACE, f"--duration={TOKEN_DURATION}", *bound],
    ).stdout.strip()
    name = pod or kind
    path = layout.component_kubeconfig(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    token_file = path.with_name(f"{name}.token")
    token_file.write_text(token)
    token_file.chmod(0o600)
    server, ca = _server_and_ca(admin_kubeconfig)
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "neuron-dra", "cluster": {"server": server, "certificate-authority": ca}}
        ],
        "users": [{"name": account, "user": {"tokenFile": str(token_file.resolve())}}],
        "contexts": [{"name": "neuron-dra", "context": {"cluster": "neuron-dra", "user": account}}],
        "current-context": "neuron-dra",
    }
    tmp = path.with_suffix(".tmp")
    # JSON is YAML: kubectl reads it as it reads any kubeconfig, and the services read it
    # without loading a YAML parser (about 1 MiB in each process).
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(path)
    return path


def service_kubeconfigs(
    layout: Layout,
    admin_kubeconfig: Path,
    kinds: Iterable[str] = sorted(ACCOUNTS.keys() - NODE_AGENTS),
    *,
    tree: Path = BASE,
) -> dict[str, Path]:
    """:func:`apply_accounts` of ``tree``, then a kubeconfig per service kind (by default
    every one but the node agents')."""
    apply_accounts(admin_kubeconfig, tree)
    return {kind: service_kubeconfig(layout, admin_kubeconfig, kind) for kind in kinds}


def node_agent_name(kind: str, node: str) -> str:
    """The name of the agent ``kind`` of ``node`` on the stack: its component's, its Pod's
    and its kubeconfig's."""
    return f"{kind}-{node}"


def node_agent_pod(kind: str, node: str, *, account: str = "") -> dict[str, object]:
    """The Pod standing for the agent ``kind`` of ``node``: bound to the node, run as the
    agent's ServiceAccount, tolerating every taint (as a DaemonSet's pods do, so an
    unreachable node's eviction never revokes its agent's token); named
    :func:`node_agent_name`."""
    account = account or ACCOUNTS[kind]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": node_agent_name(kind, node),
            "namespace": NAMESPACE,
            # Not the workload's labels: nothing that selects the driver's pods selects it.
            "labels": {"neuron.aws.com/stands-for": kind},
            "annotations": {
                "neuron.aws.com/stands-for": (
                    f"the {kind} process of the local stack's node {node} (its token is bound "
                    "to this pod)"
                ),
            },
        },
        "spec": {
            "nodeName": node,
            "serviceAccountName": account,
            "automountServiceAccountToken": False,
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": kind,
                    "image": "neuron-dra",
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "runAsNonRoot": True,
                        "runAsUser": 65532,
                        "capabilities": {"drop": ["ALL"]},
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                }
            ],
        },
    }


def node_agent_kubeconfigs(
    layout: Layout, admin_kubeconfig: Path, kind: str, nodes: Sequence[str], *, account: str = ""
) -> dict[str, Path]:
    """Each node's kubeconfig for its agent ``kind``: the agent's Pod on that node
    (:func:`node_agent_pod`, made) and a token bound to it, which names the node; by
    :func:`node_agent_name`. The ServiceAccount exists."""
    if not nodes:
        return {}
    pods = [node_agent_pod(kind, node, account=account) for node in nodes]
    # Made anew: a pod's spec is immutable, and one left by an earlier stack of this state
    # directory (its etcd keeps it) may have another (its old tokens go with it).
    names = [node_agent_name(kind, node) for node in nodes]
    kubectl.run(
        admin_kubeconfig,
        ["delete", "pod", "-n", NAMESPACE, "--ignore-not-found", "--force", "--grace-period=0",
         *names],
    )  # fmt: skip
    kubectl.run(
        admin_kubeconfig,
        ["create", "-f", "-"],
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": pods}),
    )

    def one(pod: str) -> Path:
        return service_kubeconfig(layout, admin_kubeconfig, kind, account=account, pod=pod)

    # A kubectl call is mostly waiting on the apiserver: a few at once.
    with ThreadPoolExecutor(max_workers=min(8, len(names))) as pool:
        return dict(zip(names, pool.map(one, names), strict=True))
