"""The simulated EFA DRA driver on the local stack: one process for every node with EFA.

AWS's EFA DRA driver (``dra.net``, DeviceClass ``efa.networking.k8s.aws``) runs beside the
Neuron driver on EKS; AWS's UltraServer guide requires it for workloads of more than one
UltraServer. The stack runs a stand-in (``neuron_dra_kubelet_plugin.efasim``) that publishes
each Neuron node's EFA interfaces (16 on trn2.48xlarge and trn2u.48xlarge, AWS's figure) and
prepares them through the node's hollow kubelet, writing CDI specs beside the Neuron plugin's.
``neuron-dra dev up --efa`` starts it, as AWS's driver is installed on a cluster (a Helm chart
of its own); without it the stack is a cluster without EFA.

API access: the admin kubeconfig. It stands in for a driver of its own vendor, whose
ServiceAccount and RBAC are not the Neuron driver's to ship.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import msgspec
from neuron_dra_common.efa import efa_interfaces
from neuron_dra_common.topology import instance_spec

from neuron_dra_cli.stack.components import Component, python_service
from neuron_dra_cli.stack.fleet import Fleet
from neuron_dra_cli.stack.layout import Layout
from neuron_dra_cli.stack.nodes import kubelet_root
from neuron_dra_cli.stack.plugin import cdi_root, hardware_root

__all__ = ["KIND", "efa_component", "efa_nodes"]

KIND: Final = "efa-simulator"
MODULE: Final = "neuron_dra_kubelet_plugin.efasim"


def efa_nodes(fleet: Fleet, layout: Layout) -> list[dict[str, str]]:
    """The nodes the simulated driver serves: every node of the Neuron DRA driver whose
    instance type has EFA interfaces in the catalog."""
    return [
        {
            "name": n.name,
            "instanceType": n.instance_type,
            "kubeletRoot": str(kubelet_root(layout, n.name).absolute()),
            "cdiRoot": str(cdi_root(layout, n.name)),
            "devRoot": str(hardware_root(layout, n.name) / "dev"),
        }
        for n in fleet.nodes
        if n.dra and efa_interfaces(instance_spec(n.instance_type))
    ]


def efa_component(*, fleet: Fleet, layout: Layout, kubeconfig: Path) -> Component | None:
    """The simulated EFA driver of ``fleet``; ``None`` when no node has EFA. Ready once every
    node's kubelet registered it."""
    nodes = efa_nodes(fleet, layout)
    if not nodes:
        return None
    nodes_file = layout.root / "efa-nodes.json"
    nodes_file.write_bytes(msgspec.json.encode(nodes))
    return python_service(
        name=KIND,
        kind=KIND,
        module=MODULE,
        ready_path="/readyz",
        env={"NEURON_DRA_NODES_FILE": str(nodes_file), "NEURON_DRA_KUBECONFIG": str(kubeconfig)},
    )
