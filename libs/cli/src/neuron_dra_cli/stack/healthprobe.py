"""The health probe on the local stack: one per simulated Neuron node, beside discovery.

Each probe follows its node's simulated kernel log (``<hw>/var/log/kern.log``, where
``neuron-dra dev fault`` writes the driver's error lines) and reads the node's simulated
sysfs. API access: as on a cluster, the probe runs as the ``neuron-dra-health-probe``
ServiceAccount bound to the ClusterRole in ``deploy/kustomize/base/health-probe``, with a token
of that account (``stack.accounts``), so the stack exercises the DaemonSet's RBAC (read its
Node, patch its status) and nothing more.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from neuron_dra_common.hardware.layout import NodePaths

from neuron_dra_cli.stack.components import Component, python_service
from neuron_dra_cli.stack.fleet import Fleet
from neuron_dra_cli.stack.layout import Layout

__all__ = ["KIND", "probe_components"]

KIND: Final = "health-probe"


def probe_components(
    *, fleet: Fleet, layout: Layout, nats_url: str, kubeconfig: Path
) -> list[Component]:
    """One probe per managed node; ``kubeconfig`` is the probe's own (a token of its
    ServiceAccount, ``stack.accounts``)."""
    own = kubeconfig
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
