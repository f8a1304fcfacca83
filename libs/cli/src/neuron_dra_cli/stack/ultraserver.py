"""The UltraServer part of the product on the local stack: the topology allocator and the
UltraServer operator, one process each.

The CRDs they serve come with the local overlay (``deploy/kustomize/base/crds``), applied by
``services.apply_cluster_objects`` before these start. Start them after NATS, the apiserver
and discovery: the allocator replays the fleet from the bus, the operator waits for its
informers, and neither answers before.
"""

from __future__ import annotations

import sys
from pathlib import Path

from neuron_dra_cli.stack import probes, process
from neuron_dra_cli.stack.components import Component

__all__ = ["ultraserver_components"]


def _service(*, name: str, module: str, env: dict[str, str]) -> Component:
    port = process.free_port()
    return Component(
        name=name,
        kind=name,
        argv=[sys.executable, "-m", module],
        ports={"http": port},
        ready=lambda: probes.tcp_open(port),
        env={**env, "NEURON_DRA_HTTP_HOST": "127.0.0.1", "NEURON_DRA_HTTP_PORT": str(port)},
    )


def ultraserver_components(
    *, nats_url: str, kubeconfig: Path, strategy: str = "best-fit"
) -> list[Component]:
    """The allocator (placement ``strategy``: best-fit or first-fit) and the operator."""
    return [
        _service(
            name="topology-allocator",
            module="neuron_dra_topology_allocator",
            env={"NEURON_DRA_NATS_SERVERS": nats_url, "NEURON_DRA_STRATEGY": strategy},
        ),
        _service(
            name="ultraserver-operator",
            module="neuron_dra_ultraserver_operator",
            env={"NEURON_DRA_NATS_SERVERS": nats_url, "NEURON_DRA_KUBECONFIG": str(kubeconfig)},
        ),
    ]
