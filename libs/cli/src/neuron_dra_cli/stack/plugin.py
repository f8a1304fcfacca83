"""The kubelet plugin on the local stack: one process per simulated node.

Each plugin serves its node's kubelet root (the hollow kubelet finds it under
``plugins_registry`` and calls it exactly as a kubelet on EKS does), reads the node's
simulated hardware, and writes CDI specs under ``<state>/nodes/<name>/cdi``.

API access: as on a cluster, the plugin runs as the ``neuron-dra-kubelet-plugin``
ServiceAccount bound to the ClusterRole in ``deploy/kustomize/base/kubelet-plugin``, with a
token of that account (``stack.accounts``), so the local stack exercises the DaemonSet's
least-privilege RBAC rather than admin rights. On a node whose kubelet the plugin warns about
(a fleet group's ``kubeletVersion`` of ``kubebuild.NODE_RELEASES``), where it writes its Node's
``NeuronHealth``, the token is bound to a pod on that node
(``stack.accounts.node_agent_kubeconfigs``), as the admission policy
``neuron-dra-kubelet-plugin-nodes`` asks; elsewhere it writes no Node and a plain token saves
the simulated kubelets a pod each.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Final

from neuron_dra_cli.stack import accounts
from neuron_dra_cli.stack.components import Component, python_service
from neuron_dra_cli.stack.fleet import Fleet, NodeSpec
from neuron_dra_cli.stack.layout import Layout
from neuron_dra_cli.stack.nodes import kubelet_root

__all__ = [
    "KIND",
    "apply_plugin_rbac",
    "cdi_root",
    "hardware_root",
    "kubelet_agent_env",
    "plugin_component",
    "plugin_components",
]

KIND: Final = "kubelet-plugin"


def hardware_root(layout: Layout, node: str) -> Path:
    """Where the stack writes a node's simulated hardware (``stack.services`` does)."""
    return layout.node_dir(node) / "hw"


def cdi_root(layout: Layout, node: str) -> Path:
    """Where a node's plugin writes its CDI specs (``neuron-dra dev env`` reads them)."""
    return layout.node_dir(node) / "cdi"


def apply_plugin_rbac(*, layout: Layout, kubeconfig: Path) -> Path:
    """Apply the services' accounts and RBAC from the base; return the plugins' kubeconfig
    (a token of the ``neuron-dra-kubelet-plugin`` ServiceAccount).

    ``kubeconfig`` is the admin one (to apply the RBAC objects and request the token).
    """
    accounts.apply_accounts(kubeconfig)
    return accounts.service_kubeconfig(layout, kubeconfig, KIND)


def kubelet_agent_env(
    *, node: NodeSpec, layout: Layout, nats_url: str, kubeconfig: Path
) -> dict[str, str]:
    """What a plugin of the node's kubelet (the DRA plugin, the device plugin) is told: its
    node, the kubelet's root, the node's simulated hardware (written already), its own
    kubeconfig and NATS."""
    hw = hardware_root(layout, node.name)
    if not (hw / "sys").is_dir():
        raise FileNotFoundError(
            f"node {node.name}: no simulated hardware under {hw}; write it first "
            "(stack.services.write_fleet_hardware does)"
        )
    return {
        "NEURON_DRA_NODE_NAME": node.name,
        "NEURON_DRA_KUBELET_ROOT": str(kubelet_root(layout, node.name)),
        "NEURON_DRA_HOST_ROOT": str(hw),
        "NEURON_DRA_NEURON_LS_COMMAND": f"{hw}/opt/aws/neuron/bin/neuron-ls,-j",
        "NEURON_DRA_KUBECONFIG": str(kubeconfig),
        "NEURON_DRA_NATS_SERVERS": nats_url,
    }


def plugin_component(
    *,
    node: NodeSpec,
    layout: Layout,
    nats_url: str,
    kubeconfig: Path,
    env: dict[str, str] | None = None,
) -> Component:
    """The plugin process of one node; ``kubeconfig`` is the plugin's own (RBAC-bound).

    ``env`` adds variables (tests set the crash point this way).
    """
    return python_service(
        name=f"{KIND}-{node.name}",
        kind=KIND,
        module="neuron_dra_kubelet_plugin",
        # Ready once the node's kubelet registered it: from then on pods can use the node.
        ready_path="/readyz",
        env={
            **kubelet_agent_env(node=node, layout=layout, nats_url=nats_url, kubeconfig=kubeconfig),
            "NEURON_DRA_CDI_ROOT": str(cdi_root(layout, node.name)),
            "NEURON_DRA_PROBE_INTERVAL": "5",
            **(env or {}),
        },
    )


def plugin_components(
    *,
    fleet: Fleet,
    layout: Layout,
    nats_url: str,
    kubeconfig: Path,
    plugin_kubeconfig: Path | None = None,
    kubeconfigs: Mapping[str, Path] | None = None,
) -> list[Component]:
    """One kubelet plugin per node of ``fleet`` (none on a node of the device plugin).

    Call it once the apiserver is up and the nodes' hardware is written (after
    ``services.product_components``); ``kubeconfig`` is the admin one, used only to bind the
    plugins' own identity to the DaemonSet's ClusterRole, unless ``plugin_kubeconfig`` is
    what :func:`apply_plugin_rbac` returned already. ``kubeconfigs`` by component name (a
    token bound to a pod on the plugin's node, see above) come first.
    """
    found = dict(kubeconfigs or {})
    nodes = [n for n in fleet.nodes if n.dra]
    if any(f"{KIND}-{n.name}" not in found for n in nodes):
        own = plugin_kubeconfig or apply_plugin_rbac(layout=layout, kubeconfig=kubeconfig)
        found = {f"{KIND}-{n.name}": own for n in nodes} | found
    return [
        plugin_component(
            node=node, layout=layout, nats_url=nats_url, kubeconfig=found[f"{KIND}-{node.name}"]
        )
        for node in nodes
    ]
