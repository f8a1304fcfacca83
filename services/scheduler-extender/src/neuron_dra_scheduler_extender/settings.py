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

    # The probes and metrics stay on ServiceSettings' plain ``http_port`` (8080), where the
    # kubelet and Prometheus reach them without a client certificate; the verbs move a pod
    # onto a node and are served apart, over TLS with client certificates only.
    # AWS's scheduler extension listens on 12345 and its KubeSchedulerConfiguration says so.
    verbs_port: Annotated[
        int,
        msgspec.Meta(
            ge=0,
            le=65535,
            description="Port of the extender verbs (/filter, /prioritize, /bind), HTTPS with "
            "client certificates (0: any free); /metrics, /healthz and /readyz are on "
            "--http-port",
        ),
    ] = 12345
    tls_cert: Annotated[
        str, msgspec.Meta(description="The verbs' serving certificate (PEM, e.g. tls.crt)")
    ] = ""
    tls_key: Annotated[
        str, msgspec.Meta(description="Key of the serving certificate (PEM, e.g. tls.key)")
    ] = ""
    tls_client_ca: Annotated[
        str,
        msgspec.Meta(
            description="CA bundle (PEM, e.g. ca.crt) that signs the scheduler's client "
            "certificate; a client without a certificate it signs is refused at the handshake"
        ),
    ] = ""
    verbs_insecure_http: Annotated[
        bool,
        msgspec.Meta(
            description="DEBUGGING ONLY: serve the verbs over plain HTTP with no client "
            "authentication: anyone who reaches the port can bind pods to nodes"
        ),
    ] = False
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
