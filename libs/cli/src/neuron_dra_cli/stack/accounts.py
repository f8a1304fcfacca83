"""Each neuron-dra service on the local stack runs with its own ServiceAccount's token.

The ServiceAccounts, roles and bindings are the ones ``deploy/kustomize/base`` installs on a
cluster, applied as they are; each service then gets a token of its account from the
TokenRequest API (``kubectl create token``), kept in a file its kubeconfig names as
``tokenFile``, as a pod's projected token is. So the stack exercises the manifests' RBAC and
admission policies, never admin rights.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Final

import yaml

from neuron_dra_cli.stack import kubectl
from neuron_dra_cli.stack.layout import Layout

__all__ = [
    "ACCOUNTS",
    "BASE",
    "NAMESPACE",
    "RBAC_KINDS",
    "apply_accounts",
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
}

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
    layout: Layout, admin_kubeconfig: Path, kind: str, *, account: str = ""
) -> Path:
    """A kubeconfig for the service ``kind`` with a fresh token of its ServiceAccount
    (``account``, or the one :data:`ACCOUNTS` names)."""
    account = account or ACCOUNTS[kind]
    token = kubectl.run(
        admin_kubeconfig,
        ["create", "token", account, "-n", NAMESPACE, f"--duration={TOKEN_DURATION}"],
    ).stdout.strip()
    path = layout.component_kubeconfig(kind)
    path.parent.mkdir(parents=True, exist_ok=True)
    token_file = path.with_name(f"{kind}.token")
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
    layout: Layout, admin_kubeconfig: Path, kinds: Iterable[str] = ACCOUNTS, *, tree: Path = BASE
) -> dict[str, Path]:
    """:func:`apply_accounts` of ``tree``, then a kubeconfig per service kind."""
    apply_accounts(admin_kubeconfig, tree)
    return {kind: service_kubeconfig(layout, admin_kubeconfig, kind) for kind in kinds}
