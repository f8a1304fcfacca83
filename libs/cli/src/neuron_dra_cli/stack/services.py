"""The product on the local stack: simulated hardware per node, one discovery process per
node, the slice publisher, and the cluster objects they need (namespace, DeviceClass).

``lifecycle.up`` calls :func:`apply_cluster_objects` and :func:`product_components` once the
control plane is up, and starts the components with its launcher like any other.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from neuron_dra_common.bus.declarations import PUBLISHER_SHARES
from neuron_dra_common.hardware.simulate import SimNode

from neuron_dra_cli.stack import kubectl
from neuron_dra_cli.stack.components import Component, python_service
from neuron_dra_cli.stack.fleet import UNMANAGED_LABEL, Fleet, NodeSpec
from neuron_dra_cli.stack.layout import Layout

__all__ = [
    "LOCAL_OVERLAY",
    "UNMANAGED_LABEL",
    "apply_cluster_objects",
    "hardware_root",
    "product_components",
    "write_fleet_hardware",
]

REPO = Path(__file__).resolve().parents[5]
LOCAL_OVERLAY = REPO / "deploy" / "kustomize" / "overlays" / "local-processes"


def hardware_root(layout: Layout, node: str) -> Path:
    """Where a simulated node's sysfs, /dev and neuron-ls live."""
    return layout.node_dir(node) / "hw"


def _write_hardware(layout: Layout, node: NodeSpec) -> SimNode:
    from neuron_dra_common.hardware.simulate import SimUltraServer, write_node

    us = node.ultraserver
    sim_us = None
    if us is not None:
        sim_us = SimUltraServer(
            server_id_2=us.server_id_2,
            server_id_4=us.server_id_4,
            node_id_2=us.node_id_2,
            node_id_4=us.node_id_4,
            supported_modes=(1, 2, 3, 4),
            reservation_id=us.server_id_4,
            node_id=us.node_id_4,
        )
    sim = write_node(
        hardware_root(layout, node.name),
        instance_type=node.instance_type,
        node_name=node.name,
        driver_version=node.driver_version,
        lnc=node.lnc,
        ultraserver=sim_us,
    )
    return sim


def write_fleet_hardware(*, fleet: Fleet, layout: Layout) -> dict[str, SimNode]:
    """Write the simulated hardware of every managed node (a few thousand small files per
    node, so ``lifecycle.up`` does it while the control plane starts)."""
    return {node.name: _write_hardware(layout, node) for node in fleet.nodes if node.managed}


def product_components(
    *,
    fleet: Fleet,
    layout: Layout,
    nats_url: str,
    kubeconfig: Path,
    hardware: Mapping[str, SimNode] | None = None,
    kubelet_healthz: Mapping[str, int] | None = None,
) -> list[Component]:
    """One discovery per node and the publisher, with every node's simulated hardware
    written (unless ``hardware`` holds what :func:`write_fleet_hardware` wrote).
    ``kubeconfig`` is the slice publisher's own (``stack.accounts``).

    Nodes labelled ``neuron.aws.com/driver: "false"`` in the fleet are skipped, and nodes of
    the device plugin get no discovery (their hardware is written: the plugin and the health
    probe read it). Discovery
    polls every 2 s on the stack so that a hardware edit shows within seconds (its heartbeats
    go every second regardless; the health probe reads errors every second). With
    ``kubelet_healthz`` (node -> its kubelet's healthz port), a node's heartbeats stop while
    its kubelet does not answer, as on a real node.
    """
    items: list[Component] = []
    for node in fleet.nodes:
        if not node.managed:
            continue
        sim = hardware[node.name] if hardware is not None else _write_hardware(layout, node)
        if node.device_plugin:
            continue
        items.append(
            python_service(
                name=f"discovery-{node.name}",
                kind="discovery",
                module="neuron_dra_discovery",
                env={
                    "NEURON_DRA_NODE_NAME": node.name,
                    "NEURON_DRA_HOST_ROOT": str(sim.root),
                    "NEURON_DRA_NEURON_LS_COMMAND": ",".join(sim.neuron_ls_command),
                    "NEURON_DRA_NATS_SERVERS": nats_url,
                    "NEURON_DRA_POLL_SECONDS": "2",
                    "NEURON_DRA_LOG_LEVEL": "warning",
                    **(
                        {
                            "NEURON_DRA_KUBELET_HEALTHZ_URL": "http://127.0.0.1:"
                            f"{kubelet_healthz[node.name]}/healthz"
                        }
                        if kubelet_healthz and node.name in kubelet_healthz
                        else {}
                    ),
                },
            )
        )
    # NEURON_DRA_SLICE_PUBLISHERS=2: two publishers sharing the nodes (a Lease per share).
    publishers = int(os.environ.get("NEURON_DRA_SLICE_PUBLISHERS") or 1)
    if not 1 <= publishers <= PUBLISHER_SHARES:
        raise ValueError(
            f"NEURON_DRA_SLICE_PUBLISHERS: {publishers} is not between 1 and {PUBLISHER_SHARES}"
        )
    for i in range(publishers):
        suffix = f"-{i + 1}" if i else ""
        items.append(
            python_service(
                name=f"slice-publisher{suffix}",
                kind="slice-publisher",
                module="neuron_dra_slice_publisher",
                env={
                    "NEURON_DRA_KUBECONFIG": str(kubeconfig),
                    "NEURON_DRA_NATS_SERVERS": nats_url,
                    "NEURON_DRA_IDENTITY": f"local{suffix}",
                    "NEURON_DRA_LEASE_SECONDS": "6",
                    "NEURON_DRA_PARTITIONS": str(publishers),
                },
            )
        )
    return items


def apply_cluster_objects(kubeconfig: Path, *, overlay: Path = LOCAL_OVERLAY) -> None:
    """Apply the local overlay (namespace, DeviceClass) with the stack's kubectl."""
    kubectl.run(kubeconfig, ["apply", "-k", str(overlay)])
