"""The device plugin on a real node (``dev up --real-nodes 1 --real-node-device-plugin``).

A cluster that keeps pods written for AWS's Neuron device plugin (``resources.limits`` of
``aws.amazon.com/neuron``) beside DRA nodes runs the device-plugin component
(``deploy/kustomize/components/device-plugin``) on the nodes labelled
``neuron.aws.com/device-management=device-plugin``, and the scheduler extender in its
kube-scheduler (``components/scheduler-extender/default-scheduler``). The stack does the
same: its one real node gets that label and the component's DaemonSet as a real container,
from a small kustomization of the stack's own that references the component and patches
only what differs on this machine:

- the network: the host's, so NATS and the apiserver (processes on the host's loopback) are
  reached at the stack's own addresses, and the HTTP port is a free one;
- the paths: the node's simulated hardware, in the node's folder. The kubelet's device
  manager socket stays at ``/var/lib/kubelet/device-plugins`` whatever the kubelet's root
  (a constant of the device plugin API), which is why one real node per host can have it.

Its kube-scheduler reads the component's KubeSchedulerConfiguration with the extenders
pointed at the extender, a process of the stack. The simulated nodes keep their DRA agents.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from neuron_dra_cli.errors import CliError
from neuron_dra_cli.stack import accounts, components, kubectl, process, realdriver
from neuron_dra_cli.stack.layout import Layout
from neuron_dra_cli.stack.pki import CertPair, Pki

__all__ = [
    "DAEMONSET",
    "EXTENDER_ACCOUNT",
    "EXTENDER_KIND",
    "NODE_LABELS",
    "ExtenderTls",
    "PluginSetup",
    "apply",
    "check_count",
    "extender",
    "extender_kubeconfig",
    "extender_tls",
    "kustomization",
    "render",
    "scheduler_config",
    "scheduler_config_file",
]

REPO = Path(__file__).resolve().parents[5]
COMPONENT = REPO / "deploy" / "kustomize" / "components" / "device-plugin"
BUS_AUTH_COMPONENT = REPO / "deploy" / "kustomize" / "components" / "device-plugin-bus-auth"
EXTENDER_COMPONENT = REPO / "deploy" / "kustomize" / "components" / "scheduler-extender"
SCHEDULER_CONFIG = EXTENDER_COMPONENT / "default-scheduler" / "kube-scheduler-config.yaml"
#: The extender's own ServiceAccount in its component: the stack runs it with that account's
#: token and the component's ClusterRole, as on a cluster, never as admin.
EXTENDER_ACCOUNT: Final = "neuron-dra-scheduler-extender"
EXTENDER_KIND: Final = "scheduler-extender"
NAMESPACE: Final = "neuron-dra-driver"
DAEMONSET: Final = "neuron-dra-device-plugin"
#: The component's node selection, and the instance type the extender reads.
NODE_LABELS: Final = {
    "neuron.aws.com/device-management": "device-plugin",
    "node.kubernetes.io/instance-type": "trn2.48xlarge",
}


@dataclass(frozen=True)
class PluginSetup:
    """What the DaemonSet's patches need of the stack and its real node."""

    image: str  # the product's image as imported (``localhost/neuron-dra:<tag>``)
    nats_url: str
    apiserver_port: int
    hardware: Path
    http_port: int
    #: On the authenticated bus: the plugin presents its projected bus token and NATS's CA;
    #: False (``--insecure-bus``): it is told the bus is open.
    bus_auth: bool = True


def _host(path: Path) -> dict[str, str]:
    return {"path": str(path.resolve()), "type": "Directory"}


def kustomization(setup: PluginSetup, *, folder: Path, component: Path = COMPONENT) -> str:
    """The stack's kustomization (JSON, which is YAML) in ``folder``: ``component`` with the
    patches of this machine."""
    hw = setup.hardware
    env = {
        "NEURON_DRA_NATS_SERVERS": setup.nats_url,
        "NEURON_DRA_HTTP_PORT": str(setup.http_port),
        # Allocate's device paths are read by containerd on the host.
        "NEURON_DRA_DEV_ROOT": str((hw / "dev").resolve()),
        # No kube-proxy on the stack: the apiserver's own address.
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(setup.apiserver_port),
        **({} if setup.bus_auth else {"NEURON_DRA_INSECURE_BUS": "1"}),
    }
    patch = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": DAEMONSET},
        "spec": {
            "template": {
                "spec": {
                    # NATS and the apiserver listen on the host's loopback only.
                    "hostNetwork": True,
                    "dnsPolicy": "ClusterFirstWithHostNet",
                    "containers": [
                        {
                            "name": "device-plugin",
                            "env": [{"name": k, "value": v} for k, v in env.items()],
                        }
                    ],
                    "volumes": [
                        {"name": "sys", "hostPath": _host(hw / "sys")},
                        {"name": "dev", "hostPath": _host(hw / "dev")},
                        {"name": "neuron", "hostPath": _host(hw / "opt" / "aws" / "neuron")},
                    ],
                }
            }
        },
    }
    container = "/spec/template/spec/containers/0"
    # JSON patches: a strategic merge would add a second port.
    ops = [
        {"op": "replace", "path": f"{container}/ports/0/containerPort", "value": setup.http_port},
        # The image is only in the node's containerd: never try a registry.
        {"op": "add", "path": f"{container}/imagePullPolicy", "value": "Never"},
    ]
    name, tag = setup.image.rsplit(":", 1)
    target = {"kind": "DaemonSet", "name": DAEMONSET}
    doc = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        # kustomize takes a component only by a relative path.
        "components": [
            os.path.relpath(c.resolve(), folder.resolve())
            for c in (component, *([BUS_AUTH_COMPONENT] if setup.bus_auth else []))
        ],
        "images": [{"name": "neuron-dra", "newName": name, "newTag": tag}],
        "patches": [
            {"target": target, "patch": json.dumps(patch)},
            {"target": target, "patch": json.dumps(ops)},
        ],
    }
    return json.dumps(doc, indent=2) + "\n"


def render(kubeconfig: Path, folder: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize folder``: the DaemonSet, its ServiceAccount and RBAC."""
    out = kubectl.run(kubeconfig, ["kustomize", str(folder)]).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def apply(
    *,
    layout: Layout,
    kubeconfig: Path,
    setup: PluginSetup,
    node: str,
    pki: Pki,
    timeout: float = 180.0,
) -> None:
    """Write the stack's kustomization, apply what it renders (the DaemonSet, its account
    and RBAC; on the authenticated bus also the Secret its projected volume reads), and wait
    until the DaemonSet's pod is Ready on ``node``."""
    folder = layout.root / "real-node-device-plugin"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kustomization.yaml").write_text(kustomization(setup, folder=folder))
    objects = render(kubeconfig, folder)
    if setup.bus_auth:
        # Before the pod: the kubelet does not start a container whose volume lacks it.
        objects.insert(0, realdriver.nats_tls_secret(pki))
    kubectl.run(
        kubeconfig,
        ["apply", "-f", "-"],
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}),
    )
    realdriver.wait_ready(kubeconfig, workloads=(DAEMONSET,), nodes=(node,), timeout=timeout)


@dataclass(frozen=True)
class ExtenderTls:
    """The files of the extender's mutual TLS: one CA signs both the extender's serving
    certificate and the scheduler's client certificate."""

    ca: Path
    server: CertPair
    client: CertPair


def extender_tls(folder: Path) -> ExtenderTls:
    """The extender's CA and certificates under ``folder``, made once. A CA of its own, not
    the cluster's: a node's kubelet certificate, which the cluster CA signs, must not open
    the verbs."""
    pki = Pki(folder)
    return ExtenderTls(
        ca=pki.ca.cert,
        server=pki.scheduler_extender(),
        client=pki.client("kube-scheduler-extender-client", user="kube-scheduler"),
    )


def extender(*, kubeconfig: Path, tls: ExtenderTls) -> components.Component:
    """The scheduler extender, a process of the stack calling the API with ``kubeconfig``
    (see :func:`extender_kubeconfig`): its probes and metrics on a free loopback port
    (``http``), its verbs over HTTPS with client certificates on another (``verbs``)."""
    verbs_port = process.free_port()
    component = components.python_service(
        name="scheduler-extender",
        kind=EXTENDER_KIND,
        module="neuron_dra_scheduler_extender",
        env={
            "NEURON_DRA_KUBECONFIG": str(kubeconfig),
            "NEURON_DRA_VERBS_PORT": str(verbs_port),
            "NEURON_DRA_TLS_CERT": str(tls.server.cert),
            "NEURON_DRA_TLS_KEY": str(tls.server.key),
            "NEURON_DRA_TLS_CLIENT_CA": str(tls.ca),
        },
        ready_path="/readyz",
    )
    component.ports["verbs"] = verbs_port
    return component


def extender_kubeconfig(layout: Layout, admin_kubeconfig: Path) -> Path:
    """Apply the extender component's ServiceAccount and RBAC as they are, and write the
    extender's kubeconfig with a token of that account (at the path
    ``layout.component_kubeconfig("scheduler-extender")``, known before it is written)."""
    kubectl.run(admin_kubeconfig, ["apply", "-f", str(EXTENDER_COMPONENT / "rbac.yaml")])
    return accounts.service_kubeconfig(
        layout, admin_kubeconfig, EXTENDER_KIND, account=EXTENDER_ACCOUNT
    )


def scheduler_config(
    source: dict[str, Any],
    *,
    extender_url: str,
    node_cache: bool | None = None,
    tls: ExtenderTls | None = None,
) -> dict[str, Any]:
    """The component's KubeSchedulerConfiguration ``source`` with its extenders at
    ``extender_url`` (the component's is a cluster IP, which the stack has not), their
    ``nodeCacheCapable`` set to ``node_cache`` unless None (as a configuration written for
    AWS's extension may have it), and with ``tls`` their ``tlsConfig`` files (the
    component's ``serverName`` is kept)."""
    config = copy.deepcopy(source)
    extenders = config.get("extenders") or []
    if not extenders:
        raise CliError(f"{SCHEDULER_CONFIG}: no extenders to point at {extender_url}")
    for entry in extenders:
        entry["urlPrefix"] = extender_url
        if node_cache is not None:
            entry["nodeCacheCapable"] = node_cache
        if tls is not None:
            entry["tlsConfig"] = {
                **(entry.get("tlsConfig") or {}),
                "certFile": str(tls.client.cert),
                "keyFile": str(tls.client.key),
                "caFile": str(tls.ca),
            }
    return config


def scheduler_config_file(
    *, extender_url: str, kubeconfig: Path, folder: Path, tls: ExtenderTls
) -> Path:
    """The component's configuration, written to ``folder`` for the stack's kube-scheduler:
    the extender's address and certificates, this kubeconfig and no leader election (see
    :func:`components.scheduler`'s ``config``)."""
    config = scheduler_config(
        yaml.safe_load(SCHEDULER_CONFIG.read_text()), extender_url=extender_url, tls=tls
    )
    config["clientConnection"] = {"kubeconfig": str(kubeconfig)}
    config["leaderElection"] = {"leaderElect": False}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "kube-scheduler-config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def check_count(real_nodes: int, *, option: str) -> None:
    """One real node per host: the kubelet's device manager socket folder is fixed."""
    if real_nodes != 1:
        raise CliError(
            f"{option} runs the device plugin on exactly one real node (--real-nodes 1, not "
            f"{real_nodes}): the kubelet's device manager listens in "
            "/var/lib/kubelet/device-plugins whatever its root, so only one real node per "
            "host can serve device plugins"
        )
