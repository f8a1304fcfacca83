"""Prometheus metrics of the Kubernetes client and the leader election, defined once."""

from __future__ import annotations

from typing import Final

from neuron_dra_common.telemetry import Counter, Gauge

__all__ = ["LEADING", "REQUESTS", "resource_of"]

REQUESTS: Final = Counter(
    "neuron_dra_kube_requests",
    "Requests sent to the Kubernetes API, by method (WATCH for a watch) and resource "
    "(plural, with the subresource: neuronultraserverworkloads/status)",
    ["method", "resource"],
)
LEADING: Final = Gauge(
    "neuron_dra_leader",
    "1 while this process holds the named Lease and does the leader's work, else 0",
    ["lease"],
)


def resource_of(path: str) -> str:
    """The resource an API path names, without namespace and object name.

    >>> resource_of("/apis/neuron.aws.com/v1/namespaces/default/neuronultraserverworkloads/a/status")
    'neuronultraserverworkloads/status'
    >>> resource_of("/api/v1/nodes/n1")
    'nodes'
    """
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    if not parts:
        return ""
    rest = parts[2:] if parts[0] == "api" else parts[3:]
    if len(rest) > 2 and rest[0] == "namespaces":
        rest = rest[2:]
    if not rest:
        return ""
    return f"{rest[0]}/{rest[2]}" if len(rest) > 2 else rest[0]
