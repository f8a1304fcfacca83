"""The health probe on the local stack: one per simulated Neuron node, beside discovery.

Each probe follows its node's simulated kernel log (``<hw>/var/log/kern.log``, where
``neuron-dra dev fault`` writes the driver's error lines) and reads the node's simulated
sysfs. API access: as on a cluster, the probe runs as the ``neuron-dra-health-probe``
ServiceAccount bound to the ClusterRole in ``deploy/kustomize/base/health-probe``, with a token
of that account bound to a pod on its node (``stack.accounts.node_agent_kubeconfigs``), so the
stack exercises the DaemonSet's RBAC (read its Node, patch its status) and the admission policy
that keeps each probe to its own Node's conditions, and nothing more.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Final

from neuron_dra_common.hardware.layout import NodePaths

from neuron_dra_cli.stack import accounts
from neuron_dra_cli.stack.components import Component, python_service
from neuron_dra_cli.stack.fleet import Fleet
from neuron_dra_cli.stack.layout import Layout

__all__ = ["KIND", "probe_components"]

KIND: Final = "health-probe"


def probe_components(
    *, fleet: Fleet, layout: Layout, nats_url: str, kubeconfigs: Mapping[str, Path]
) -> list[Component]:
    """One probe per managed node; ``kubeconfigs`` are the probes' own, by component name
    (a token of their ServiceAccount bound to a pod on the node, ``stack.accounts``)."""
    items: list[Component] = []
    for node in fleet.nodes:
        if not node.managed:
            continue
        hw = layout.node_dir(node.name) / "hw"
        name = accounts.node_agent_name(KIND, node.name)
        items.append(
            python_service(
                name=name,
                kind=KIND,
                module="neuron_dra_health_monitor.probe_main",
                env={
                    "NEURON_DRA_NODE_NAME": node.name,
                    "NEURON_DRA_HOST_ROOT": str(hw),
                    "NEURON_DRA_KERNEL_LOG": str(NodePaths(hw).kernel_log),
                    "NEURON_DRA_STATE_PATH": str(layout.node_dir(node.name) / "health-probe.json"),
                    "NEURON_DRA_KUBECONFIG": str(kubeconfigs[name]),
                    "NEURON_DRA_NATS_SERVERS": nats_url,
                    "NEURON_DRA_POLL_SECONDS": "1",
                    "NEURON_DRA_LOG_LEVEL": "warning",
                },
            )
        )
    return items
