"""The plugin's settings; every field also reads ``NEURON_DRA_<FIELD>`` (e.g. ``NEURON_DRA_NODE_NAME``)."""

from __future__ import annotations

from typing import Annotated

import msgspec
from neuron_dra_common.extended import MANAGED_RESOURCES
from neuron_dra_common.settings import NodeLivenessSettings

__all__ = ["DevicePluginSettings"]


class DevicePluginSettings(NodeLivenessSettings, frozen=True, kw_only=True):
    """Serves this node's Neuron devices and cores to the kubelet's device manager
    (aws.amazon.com/neuron, aws.amazon.com/neurondevice, aws.amazon.com/neuroncore)."""

    kubelet_root: Annotated[str, msgspec.Meta(description="The kubelet's root directory")] = (
        "/var/lib/kubelet"
    )
    dev_root: Annotated[
        str,
        msgspec.Meta(
            description="Where the device nodes are on the host, as the kubelet is told"
            "; empty: <host-root>/dev"
        ),
    ] = ""
    resources: Annotated[
        tuple[str, ...],
        msgspec.Meta(min_length=1, description="Extended resources to serve, comma-separated"),
    ] = MANAGED_RESOURCES
    health_interval: Annotated[
        float, msgspec.Meta(gt=0, description="Seconds between looks at the devices' presence")
    ] = 5.0
    health_events: Annotated[
        bool,
        msgspec.Meta(
            description="Follow the health monitor's DeviceHealthChanged events on NATS "
            "(an unhealthy device leaves the node's allocatable count)"
        ),
    ] = True
    heartbeats: Annotated[
        bool,
        msgspec.Meta(
            description="Send the node's NodeHeartbeat on NATS every --liveness-seconds, so "
            "the cluster failure detector declares the node lost within seconds when it goes "
            "silent (on these nodes no discovery agent sends them)"
        ),
    ] = True
    kubelet_watch_interval: Annotated[
        float,
        msgspec.Meta(gt=0, description="Seconds between checks that the kubelet's socket is new"),
    ] = 1.0
    honour_annotations: Annotated[
        bool,
        msgspec.Meta(
            description="Serve the devices the scheduler extension wrote to the pod's "
            "annotations (needs read and patch on pods)"
        ),
    ] = True
    kubeconfig: Annotated[
        str, msgspec.Meta(description="kubeconfig file; empty: $KUBECONFIG or the pod's account")
    ] = ""

    def missing_bus_credentials(self) -> list[str]:
        """None needed when it neither follows health events nor sends heartbeats: then it
        never connects to the bus."""
        if not (self.health_events or self.heartbeats):
            return []
        return super().missing_bus_credentials()

    def __post_init__(self) -> None:
        for name in self.resources:
            if name not in MANAGED_RESOURCES:
                raise ValueError(
                    f"NEURON_DRA_RESOURCES: {name!r} is not one of {', '.join(MANAGED_RESOURCES)}"
                )
