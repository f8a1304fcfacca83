"""Health on the local stack: the cluster failure detector, one process.

Discovery on every node sends a heartbeat each second while the node's kubelet answers its
health check (see ``services.product_components``); the detector declares a node lost about
3 s after they stop (a kubelet killed, a node stopped) and recovered when they come back. A
discovery restarted with SIGTERM (``neuron-dra dev restart discovery-<node>``) says goodbye and
is waited for up to the detector's restart grace (30 s).
"""

from __future__ import annotations

from pathlib import Path

from neuron_dra_cli.stack.components import Component, python_service

__all__ = ["health_components"]


def health_components(*, nats_url: str, kubeconfig: Path) -> list[Component]:
    return [
        python_service(
            name="failure-detector",
            kind="failure-detector",
            module="neuron_dra_health_monitor",
            env={
                "NEURON_DRA_NATS_SERVERS": nats_url,
                "NEURON_DRA_KUBECONFIG": str(kubeconfig),
                "NEURON_DRA_IDENTITY": "local",
            },
        )
    ]
