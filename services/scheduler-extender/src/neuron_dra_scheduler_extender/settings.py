"""The scheduler extender's settings; every field also reads ``NEURON_DRA_<FIELD>``
(e.g. ``NEURON_DRA_KUBECONFIG``)."""

from __future__ import annotations

from typing import Annotated, ClassVar

import msgspec
from neuron_dra_common.settings import ServiceSettings

__all__ = ["ExtenderSettings"]


class ExtenderSettings(ServiceSettings, frozen=True, kw_only=True):
    """kube-scheduler extender for aws.amazon.com/neuron and aws.amazon.com/neuroncore: filter,
    prioritize and bind on connected Neuron devices."""

    #: It speaks HTTP to kube-scheduler, not NATS.
    bus_credentials: ClassVar[tuple[str, ...]] = ()

    # AWS's scheduler extension listens on 12345 and its KubeSchedulerConfiguration says so;
    # the verbs, probes and metrics share the port.
    http_port: Annotated[
        int,
        msgspec.Meta(
            ge=0,
            le=65535,
            description="Port of the extender verbs (/filter, /prioritize, /bind), /metrics, "
            "/healthz and /readyz (0: any free)",
        ),
    ] = 12345
    max_args_bytes: Annotated[
        int,
        msgspec.Meta(
            ge=64 * 1024,
            description="Largest /filter or /prioritize body read, in bytes (413 past it); "
            "4 MiB fits a scheduler with nodeCacheCapable: true (the pod and node names) on "
            "5,000 nodes; one sending whole Nodes (nodeCacheCapable: false) needs a few KiB "
            "more per node",
        ),
    ] = 4 * 2**20
    kubeconfig: Annotated[
        str, msgspec.Meta(description="kubeconfig file; empty: KUBECONFIG, else in-cluster")
    ] = ""
