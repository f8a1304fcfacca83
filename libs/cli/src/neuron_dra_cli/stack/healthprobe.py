"""The health probe on the local stack: one per simulated Neuron node, beside discovery.

Each probe follows its node's simulated kernel log (``<hw>/var/log/kern.log``, where
``neuron-dra dev fault`` writes the driver's error lines) and reads the node's simulated
sysfs. API access: on a cluster the probe runs as the ``neuron-dra-health-probe``
ServiceAccount bound to the ClusterRole in ``deploy/kustomize/base/health-probe``; here it
gets a client certificate for :data:`PROBE_USER` bound to that same ClusterRole, so the
stack exercises the DaemonSet's RBAC (read its Node, patch its status) and nothing more.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import yaml
from neuron_dra_common.hardware.layout import NodePaths

from neuron_dra_cli.stack import kubectl
from neuron_dra_cli.stack.components import Component, python_service
from neuron_dra_cli.stack.fleet import Fleet
from neuron_dra_cli.stack.layout import Layout
from neuron_dra_cli.stack.pki import Pki, write_kubeconfig

__all__ = ["KIND", "PROBE_USER", "apply_probe_rbac", "probe_components"]

KIND: Final = "health-probe"
PROBE_USER: Final = "neuron-dra:health-probe"
REPO: Final = Path(__file__).resolve().parents[5]
RBAC: Final = REPO / "deploy" / "kustomize" / "base" / "health-probe" / "clusterrole.yaml"


def apply_probe_rbac(*, layout: Layout, kubeconfig: Path) -> Path:
    """Bind :data:`PROBE_USER` to the DaemonSet's ClusterRole; return its kubeconfig."""
    pki = Pki(layout.pki)
    pair = pki.client(KIND, user=PROBE_USER)
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "neuron-dra-health-probe-local"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "neuron-dra-health-probe",
        },
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": PROBE_USER}],
    }
    kubectl.run(kubeconfig, ["apply", "-f", str(RBAC)])
    kubectl.run(kubeconfig, ["apply", "-f", "-"], input=yaml.safe_dump(binding))
    server = str(yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"])
    return write_kubeconfig(
        layout.component_kubeconfig(KIND), server=server, ca=pki.ca.cert, pair=pair, user=PROBE_USER
    )


def probe_components(
    *, fleet: Fleet, layout: Layout, nats_url: str, kubeconfig: Path
) -> list[Component]:
    """One probe per managed node; ``kubeconfig`` is the admin one (to apply the RBAC)."""
    own = apply_probe_rbac(layout=layout, kubeconfig=kubeconfig)
    items: list[Component] = []
    for node in fleet.nodes:
        if not node.managed:
            continue
        hw = layout.node_dir(node.name) / "hw"
        items.append(
            python_service(
                name=f"{KIND}-{node.name}",
                kind=KIND,
                module="neuron_dra_health_monitor.probe_main",
                env={
                    "NEURON_DRA_NODE_NAME": node.name,
                    "NEURON_DRA_HOST_ROOT": str(hw),
                    "NEURON_DRA_KERNEL_LOG": str(NodePaths(hw).kernel_log),
                    "NEURON_DRA_STATE_PATH": str(layout.node_dir(node.name) / "health-probe.json"),
                    "NEURON_DRA_KUBECONFIG": str(own),
                    "NEURON_DRA_NATS_SERVERS": nats_url,
                    "NEURON_DRA_POLL_SECONDS": "1",
                    "NEURON_DRA_LOG_LEVEL": "warning",
                },
            )
        )
    return items
