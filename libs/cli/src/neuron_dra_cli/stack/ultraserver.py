"""The UltraServer part of the product on the local stack: the topology allocator and the
UltraServer operator, one process each.

The CRDs they serve come with the local overlay (``deploy/kustomize/base/crds``), applied by
``services.apply_cluster_objects`` before these start. Start them after NATS, the apiserver
and discovery: the allocator replays the fleet from the bus, the operator waits for its
informers, and neither answers before.
"""

from __future__ import annotations

from pathlib import Path

from neuron_dra_cli.stack.components import Component, python_service

__all__ = ["ultraserver_components"]


def ultraserver_components(
    *, nats_url: str, kubeconfig: Path, strategy: str = "best-fit"
) -> list[Component]:
    """The allocator (placement ``strategy``: best-fit or first-fit) and the operator."""
    return [
        python_service(
            name="topology-allocator",
            kind="topology-allocator",
            module="neuron_dra_topology_allocator",
            env={"NEURON_DRA_NATS_SERVERS": nats_url, "NEURON_DRA_STRATEGY": strategy},
        ),
        python_service(
            name="ultraserver-operator",
            kind="ultraserver-operator",
            module="neuron_dra_ultraserver_operator",
            env={"NEURON_DRA_NATS_SERVERS": nats_url, "NEURON_DRA_KUBECONFIG": str(kubeconfig)},
        ),
    ]
