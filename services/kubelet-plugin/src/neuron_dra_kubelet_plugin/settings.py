"""The plugin's settings; every field also reads ``NEURON_DRA_<FIELD>`` (e.g. ``NEURON_DRA_NODE_NAME``)."""

from __future__ import annotations

from typing import Annotated, Final

import msgspec
from neuron_dra_common.settings import ServiceSettings
from neuron_dra_common.topology import InstanceSpec

__all__ = ["NODE_DEVICE", "PluginSettings", "node_device_for"]

#: The whole-node device the slice publisher adds on UltraServer nodes; an allocation of it
#: stands for every device of the node.
NODE_DEVICE: Final = "neuronnode"


def node_device_for(instance: InstanceSpec) -> str | None:
    """The node device's name where the node publishes one (UltraServer members)."""
    return NODE_DEVICE if instance.ultraserver_nodes > 1 else None


class PluginSettings(ServiceSettings, frozen=True, kw_only=True):
    """Prepares this node's Neuron claims for the kubelet (DRA driver neuron.aws.com)."""

    node_name: Annotated[
        str, msgspec.Meta(min_length=1, description="This node's name (downward API)")
    ]
    kubelet_root: Annotated[str, msgspec.Meta(description="The kubelet's root directory")] = (
        "/var/lib/kubelet"
    )
    cdi_root: Annotated[str, msgspec.Meta(description="Where CDI specs are written")] = (
        "/var/run/cdi"
    )
    host_root: Annotated[
        str, msgspec.Meta(description="Root under which the host's /sys, /dev and /opt are read")
    ] = "/"
    dev_root: Annotated[
        str,
        msgspec.Meta(
            description="Where the device nodes are on the host, as CDI specs name them "
            "(default: <host-root>/dev)"
        ),
    ] = ""
    neuron_ls_command: Annotated[
        tuple[str, ...],
        msgspec.Meta(description="neuron-ls command line, comma-separated (default neuron-ls -j)"),
    ] = ()
    neuron_ls_path: Annotated[
        str, msgspec.Meta(description="Read neuron-ls -j output from this file instead")
    ] = ""
    instance_type: Annotated[
        str, msgspec.Meta(description="Instance type override (default: the DMI product name)")
    ] = ""
    pod_uid: Annotated[str, msgspec.Meta(description="Pod UID for rolling-update sockets")] = ""
    checkpoint_path: Annotated[
        str, msgspec.Meta(description="Checkpoint file; empty: under the plugin directory")
    ] = ""
    boot_id_path: Annotated[str, msgspec.Meta(description="File holding the node's boot id")] = (
        "/proc/sys/kernel/random/boot_id"
    )
    kubeconfig: Annotated[
        str, msgspec.Meta(description="kubeconfig file; empty: $KUBECONFIG or the pod's account")
    ] = ""
    probe_interval: Annotated[
        float, msgspec.Meta(gt=0, description="Seconds between liveness calls on both sockets")
    ] = 10.0
    health_heartbeat_seconds: Annotated[
        float, msgspec.Meta(gt=0, description="Seconds between health stream re-sends")
    ] = 10.0
