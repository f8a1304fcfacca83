"""One simulated node: the real kubelet code (hollow kubelet with the DRA manager, and the
device manager on a node labelled for the device plugin)."""

from __future__ import annotations

from pathlib import Path

from neuron_dra_cli.stack import probes, process
from neuron_dra_cli.stack.components import Component
from neuron_dra_cli.stack.fleet import Fleet, NodeSpec, node_labels
from neuron_dra_cli.stack.instances import SHAPES
from neuron_dra_cli.stack.layout import Layout


def kubelet_root(layout: Layout, node: str) -> Path:
    """The node's kubelet root (``plugins_registry``, ``plugins``, ``pods`` live here),
    reached through the layout's short alias so socket paths stay within limits."""
    layout.ensure_short_nodes()
    return layout.kubelet_root(node)


def device_plugins_dir(layout: Layout, node: str) -> Path:
    """The node's device-plugin folder on the host: what its kubelet (``--device-plugins-dir``)
    sees as ``/var/lib/kubelet/device-plugins`` (``kubelet.sock``, the plugins' sockets, the
    kubelet's ``kubelet_internal_checkpoint``); a device plugin given the node's kubelet root
    registers there."""
    return kubelet_root(layout, node) / "device-plugins"


def node_component(
    *,
    fleet: Fleet,
    node: NodeSpec,
    binary: Path,
    layout: Layout,
    kubeconfig: Path,
    version: str,
) -> Component:
    shape = SHAPES[node.instance_type]
    root = kubelet_root(layout, node.name)
    root.mkdir(parents=True, exist_ok=True)
    port = process.free_port()
    healthz = process.free_port()
    labels = ",".join(f"{k}={v}" for k, v in sorted(node_labels(fleet, node).items()))
    # The kubelet's device manager, its socket folder bind-mounted in the node's own mount
    # namespace (stack.deviceplugin).
    devices = (
        [f"--device-plugins-dir={device_plugins_dir(layout, node.name)}"]
        if node.device_plugin
        else []
    )
    return Component(
        name=f"node-{node.name}",
        kind="node",
        argv=[
            str(binary),
            f"--kubeconfig={kubeconfig}",
            f"--node-name={node.name}",
            f"--root-dir={root}",
            f"--node-labels={labels}",
            f"--cpu={shape.vcpus}",
            f"--memory={shape.memory_gib}Gi",
            f"--max-pods={shape.max_pods}",
            f"--kubelet-port={port}",
            f"--healthz-port={healthz}",
            *devices,
        ],
        ports={"kubelet": port, "healthz": healthz},
        ready=lambda: probes.tcp_open(healthz),
    )
