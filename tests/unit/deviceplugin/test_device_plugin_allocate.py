"""What a container gets from Allocate, which ids the kubelet may name, and health per unit."""

from __future__ import annotations

import pytest
from neuron_dra_common.extended import CORE_RESOURCE, DEVICE_RESOURCE, LEGACY_DEVICE_RESOURCE
from neuron_dra_common.topology import InvalidDeviceCount
from neuron_dra_device_plugin.health import unhealthy_devices, unit_health
from neuron_dra_device_plugin.inventory import UnknownId
from neuron_dra_device_plugin.respond import container_edits
from neuron_dra_device_plugin.servicer import list_response

from tests.unit.deviceplugin.helpers import inventory


def test_four_trn2_devices_get_their_nodes_and_exactly_their_cores() -> None:
    edits = container_edits(
        inventory("trn2.48xlarge"),
        resource=DEVICE_RESOURCE,
        units=[7, 4, 5, 6],
        dev_root="/sim/dev",
    )
    assert [(d.container_path, d.host_path, d.permissions) for d in edits.devices] == [
        (f"/dev/neuron{d}", f"/sim/dev/neuron{d}", "rw") for d in (4, 5, 6, 7)
    ]
    # LNC 2 on trn2: device d owns cores 4d..4d+3.
    assert edits.env == {"NEURON_RT_VISIBLE_CORES": "16-31", "NEURON_LOGICAL_NC_CONFIG": "2"}


def test_lnc_1_doubles_the_cores_of_each_device() -> None:
    edits = container_edits(
        inventory("trn2.48xlarge", lnc=1), resource=DEVICE_RESOURCE, units=[1], dev_root="/dev"
    )
    assert edits.env["NEURON_RT_VISIBLE_CORES"] == "8-15"
    assert edits.env["NEURON_LOGICAL_NC_CONFIG"] == "1"


def test_cores_get_the_devices_they_sit_on_and_only_those_cores() -> None:
    edits = container_edits(
        inventory("inf1.24xlarge"), resource=CORE_RESOURCE, units=range(9), dev_root="/dev"
    )
    assert [d.container_path for d in edits.devices] == [
        "/dev/neuron0",
        "/dev/neuron1",
        "/dev/neuron2",
    ]
    assert edits.env == {"NEURON_RT_VISIBLE_CORES": "0-8"}


def test_seven_devices_on_trn1_are_refused_with_the_scheduler_extensions_text() -> None:
    with pytest.raises(InvalidDeviceCount) as refused:
        container_edits(
            inventory("trn1.32xlarge"),
            resource=LEGACY_DEVICE_RESOURCE,
            units=range(7),
            dev_root="/dev",
        )
    assert str(refused.value) == (
        "Instance type trn1.32xlarge does not support requests for device: 7. "
        "Please request a different number of devices."
    )


def test_ids_the_node_never_listed_are_refused_by_name() -> None:
    inv = inventory("inf2.xlarge")
    assert inv.ids(CORE_RESOURCE) == ("neuroncore0", "neuroncore1")
    with pytest.raises(UnknownId, match="'neuron5' is not one of this node's"):
        inv.parse(DEVICE_RESOURCE, ["neuron0", "neuron5"])
    with pytest.raises(UnknownId, match="'neuroncore0'"):
        inv.parse(DEVICE_RESOURCE, ["neuroncore0"])


def test_a_device_missing_from_sysfs_or_dev_is_unhealthy() -> None:
    assert unhealthy_devices(range(4), in_sysfs=[0, 1, 3], with_node=[0, 2, 3]) == {1, 2}


def test_the_cores_of_an_unhealthy_device_are_unhealthy_and_only_those() -> None:
    inv = inventory("trn2.48xlarge")
    health = dict(unit_health(inv, resource=CORE_RESOURCE, unhealthy=frozenset({3})))
    assert {c for c, h in health.items() if h == "Unhealthy"} == {12, 13, 14, 15}
    assert len(health) == 64


def test_the_device_list_names_every_device_with_its_health() -> None:
    response = list_response(
        inventory("inf2.24xlarge"), resource=DEVICE_RESOURCE, unhealthy=frozenset({2})
    )
    assert [(d.ID, d.health) for d in response.devices] == [
        ("neuron0", "Healthy"),
        ("neuron1", "Healthy"),
        ("neuron2", "Unhealthy"),
        ("neuron3", "Healthy"),
        ("neuron4", "Healthy"),
        ("neuron5", "Healthy"),
    ]
