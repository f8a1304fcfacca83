"""The device plugin on the stack's simulated nodes labelled
``neuron.aws.com/device-management: device-plugin`` in the fleet file: one process per node.

As on a cluster (``deploy/kustomize/components/device-plugin``), such a node runs no DRA
agent (no discovery, no kubelet plugin): its devices are served to the kubelet's device
manager as ``aws.amazon.com/neuron``, ``aws.amazon.com/neurondevice`` and
``aws.amazon.com/neuroncore``, and pods asking for them are placed by the scheduler extender
in the stack's kube-scheduler.

The node's hollow kubelet runs the kubelet's own device manager. Its socket folder is
``/var/lib/kubelet/device-plugins`` on every kubelet, so each such node runs in a mount
namespace of its own with ``<kubelet root>/device-plugins`` bind-mounted there
(``hollow-node --device-plugins-dir``); the plugin, a process on the host, registers at
``<kubelet root>/device-plugins/kubelet.sock`` and serves its socket beside it, and the
kubelet calls ListAndWatch, GetPreferredAllocation and Allocate as on a real node.

API access: the component's ServiceAccount ``neuron-dra-device-plugin`` and ClusterRole,
applied as they are, never admin; each plugin's token is bound to a pod on its node
(``stack.accounts.node_agent_kubeconfigs``), so the admission policy keeping a plugin to its own
node's pods holds on the stack too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from neuron_dra_cli.stack import accounts, kubectl
from neuron_dra_cli.stack.components import Component, python_service
from neuron_dra_cli.stack.fleet import Fleet, NodeSpec
from neuron_dra_cli.stack.layout import Layout
from neuron_dra_cli.stack.plugin import kubelet_agent_env

__all__ = [
    "ACCOUNT",
    "KIND",
    "RBAC",
    "device_plugin_component",
    "device_plugin_components",
    "device_plugin_kubeconfigs",
]

KIND: Final = "device-plugin"
ACCOUNT: Final = "neuron-dra-device-plugin"
RBAC: Final = accounts.REPO / "deploy" / "kustomize" / "components" / "device-plugin" / "rbac.yaml"


def device_plugin_kubeconfigs(
    layout: Layout, admin_kubeconfig: Path, nodes: Sequence[str]
) -> dict[str, Path]:
    """Apply the component's ServiceAccount and RBAC as they are; return each node's plugin
    kubeconfig by component name (a token of that account bound to a pod on the node)."""
    kubectl.run(admin_kubeconfig, ["apply", "-f", str(RBAC)])
    return accounts.node_agent_kubeconfigs(layout, admin_kubeconfig, KIND, nodes, account=ACCOUNT)


def device_plugin_component(
    *, node: NodeSpec, layout: Layout, nats_url: str, kubeconfig: Path
) -> Component:
    """The device plugin of one node; ``kubeconfig`` is its own (RBAC-bound). Ready once
    the kubelet accepted every resource."""
    return python_service(
        name=f"{KIND}-{node.name}",
        kind=KIND,
        module="neuron_dra_device_plugin",
        ready_path="/readyz",
        env=kubelet_agent_env(node=node, layout=layout, nats_url=nats_url, kubeconfig=kubeconfig),
    )


def device_plugin_components(
    *, fleet: Fleet, layout: Layout, nats_url: str, kubeconfigs: Mapping[str, Path]
) -> list[Component]:
    """One device plugin per node of ``fleet`` that has one (:attr:`NodeSpec.device_plugin`);
    ``kubeconfigs`` by component name (:func:`device_plugin_kubeconfigs`)."""
    return [
        device_plugin_component(
            node=n,
            layout=layout,
            nats_url=nats_url,
            kubeconfig=kubeconfigs[accounts.node_agent_name(KIND, n.name)],
        )
        for n in fleet.nodes
        if n.device_plugin
    ]
