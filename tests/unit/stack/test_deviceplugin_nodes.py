"""Which processes the stack runs for a fleet node labelled for the device plugin."""

from __future__ import annotations

from pathlib import Path

import pytest
from neuron_dra_cli.stack import deviceplugin, plugin, services
from neuron_dra_cli.stack.fleet import parse_fleet
from neuron_dra_cli.stack.layout import Layout
from neuron_dra_cli.stack.nodes import device_plugins_dir, node_component

FLEET = parse_fleet(
    """
nodes:
  - instanceType: trn2.48xlarge
  - instanceType: trn2.48xlarge
    namePrefix: dp-
    labels: {neuron.aws.com/device-management: device-plugin}
  - instanceType: trn2.48xlarge
    namePrefix: bare-
    labels: {neuron.aws.com/device-management: device-plugin, neuron.aws.com/driver: "false"}
"""
)


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    return Layout(tmp_path / "state")


def test_only_a_managed_node_labelled_device_plugin_is_one() -> None:
    assert [(n.name, n.device_plugin, n.dra) for n in FLEET.nodes] == [
        ("trn2-48xl-0", False, True),
        ("dp-0", True, False),
        ("bare-0", False, False),
    ]


def test_its_kubelet_runs_the_device_manager_on_its_own_socket_folder(layout: Layout) -> None:
    def argv(node: int) -> list[str]:
        return node_component(
            fleet=FLEET,
            node=FLEET.nodes[node],
            binary=Path("/bin/hollow-node"),
            layout=layout,
            kubeconfig=Path("/k"),
            version="1.36.3",
        ).argv

    assert f"--device-plugins-dir={device_plugins_dir(layout, 'dp-0')}" in argv(1)
    assert not [a for a in argv(0) if a.startswith("--device-plugins-dir")]


def test_it_gets_a_device_plugin_and_no_dra_agent(layout: Layout) -> None:
    services.write_fleet_hardware(fleet=FLEET, layout=layout)
    nats = "nats://127.0.0.1:1"
    dra = plugin.plugin_components(
        fleet=FLEET,
        layout=layout,
        nats_url=nats,
        kubeconfig=Path("/k"),
        plugin_kubeconfig=Path("/p"),
    )
    agents = services.product_components(
        fleet=FLEET, layout=layout, nats_url=nats, kubeconfig=Path("/k")
    )
    devices = deviceplugin.device_plugin_components(
        fleet=FLEET, layout=layout, nats_url=nats, kubeconfigs={"device-plugin-dp-0": Path("/d")}
    )
    assert [c.name for c in dra] == ["kubelet-plugin-trn2-48xl-0"]
    assert [c.name for c in agents] == ["discovery-trn2-48xl-0", "slice-publisher"]
    assert [c.name for c in devices] == ["device-plugin-dp-0"]
    [device] = devices
    assert device.kind == "device-plugin"
    assert device.env["NEURON_DRA_NODE_NAME"] == "dp-0"
    # It registers where the node's kubelet listens: <kubelet root>/device-plugins.
    assert Path(device.env["NEURON_DRA_KUBELET_ROOT"]) / "device-plugins" == (
        device_plugins_dir(layout, "dp-0")
    )
    assert device.env["NEURON_DRA_KUBECONFIG"] == "/d"
    assert (Path(device.env["NEURON_DRA_HOST_ROOT"]) / "sys").is_dir()
