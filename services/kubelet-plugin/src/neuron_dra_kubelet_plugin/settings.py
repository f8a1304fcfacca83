"""The plugin's settings; every field also reads ``NEURON_DRA_<FIELD>`` (e.g. ``NEURON_DRA_NODE_NAME``)."""

from __future__ import annotations

from typing import Annotated

import msgspec
from neuron_dra_common.driver import NODE_DEVICE
from neuron_dra_common.settings import NodeHardwareSettings
from neuron_dra_common.topology import InstanceSpec

__all__ = ["PluginSettings", "node_device_for"]


def node_device_for(instance: InstanceSpec) -> str | None:
    """The node device's name where the node publishes one (UltraServer members)."""
    return NODE_DEVICE if instance.ultraserver_nodes > 1 else None


class PluginSettings(NodeHardwareSettings, frozen=True, kw_only=True):
    """Prepares this node's Neuron claims for the kubelet (DRA driver neuron.aws.com)."""

    kubelet_root: Annotated[str, msgspec.Meta(description="The kubelet's root directory")] = (
        "/var/lib/kubelet"
    )
    cdi_root: Annotated[str, msgspec.Meta(description="Where CDI specs are written")] = (
        "/var/run/cdi"
    )
    dev_root: Annotated[
        str,
        msgspec.Meta(
            description="Where the device nodes are on the host, as CDI specs name them"
            "; empty: <host-root>/dev"
        ),
    ] = ""
    pod_uid: Annotated[str, msgspec.Meta(description="Pod UID for rolling-update sockets")] = ""
    checkpoint_path: Annotated[
        str, msgspec.Meta(description="Checkpoint file; empty: under the plugin directory")
    ] = ""
    kubeconfig: Annotated[
        str, msgspec.Meta(description="kubeconfig file; empty: $KUBECONFIG or the pod's account")
    ] = ""
    probe_interval: Annotated[
        float, msgspec.Meta(gt=0, description="Seconds between liveness calls on both sockets")
    ] = 10.0
    health_heartbeat_seconds: Annotated[
        float, msgspec.Meta(gt=0, description="Seconds between health stream re-sends")
    ] = 10.0
    allow_kubelet_dra_regression: Annotated[
        bool,
        msgspec.Meta(
            description="Prepare claims even on a kubelet 1.34.0 or 1.34.1, whose DRA "
            "connection deadlocks when idle (kubernetes#133920, fixed in 1.34.2)"
        ),
    ] = False
