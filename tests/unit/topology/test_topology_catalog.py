"""The instance catalog carries AWS's published figures."""

import pytest
from neuron_dra_common.topology import (
    CATALOG,
    LinkTopology,
    UnknownInstanceType,
    catalog_instance_types,
    instance_spec,
    logical_cores_per_device,
)
from neuron_dra_common.topology.catalog import TRN2_EFA_MAP

GIB = 1073741824

# name: (devices, physical cores per device, memory per device, links, PCI device id, EFAs)
EXPECTED = {
    "inf1.xlarge": (1, 4, 8 * GIB, LinkTopology.NONE, "7064", 0),
    "inf1.2xlarge": (1, 4, 8 * GIB, LinkTopology.NONE, "7064", 0),
    "inf1.6xlarge": (4, 4, 8 * GIB, LinkTopology.RING, "7064", 0),
    "inf1.24xlarge": (16, 4, 8 * GIB, LinkTopology.RING, "7064", 0),
    "inf2.xlarge": (1, 2, 32 * GIB, LinkTopology.NONE, "7264", 0),
    "inf2.8xlarge": (1, 2, 32 * GIB, LinkTopology.NONE, "7264", 0),
    "inf2.24xlarge": (6, 2, 32 * GIB, LinkTopology.LINE, "7264", 0),
    "inf2.48xlarge": (12, 2, 32 * GIB, LinkTopology.RING, "7264", 0),
    "trn1.2xlarge": (1, 2, 32 * GIB, LinkTopology.NONE, "7164", 1),
    "trn1.32xlarge": (16, 2, 32 * GIB, LinkTopology.TORUS4X4, "7164", 8),
    "trn1n.32xlarge": (16, 2, 32 * GIB, LinkTopology.TORUS4X4, "7164", 16),
    "trn2.48xlarge": (16, 8, 103079215104, LinkTopology.TORUS4X4, "7364", 16),
    "trn2u.48xlarge": (16, 8, 103079215104, LinkTopology.TORUS4X4, "7364", 16),
    "trn3.48xlarge": (16, 8, 144 * GIB, LinkTopology.ALL_TO_ALL, None, 16),
}


def test_catalog_lists_every_supported_instance_type() -> None:
    assert set(catalog_instance_types()) == set(EXPECTED)
    assert len(CATALOG) == len(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_figures_match_aws(name: str) -> None:
    spec = instance_spec(name)
    devices, cores, memory, links, pci, efa = EXPECTED[name]
    assert spec.name == name
    assert spec.devices == devices
    assert spec.physical_cores_per_device == cores
    assert spec.memory_bytes_per_device == memory
    assert spec.topology is links
    assert spec.pci_device_id == pci
    assert spec.efa_count == efa


def test_trn2_efa_map_is_the_published_one() -> None:
    buses = [
        "c9",
        "b4",
        "b3",
        "ca",
        "6c",
        "57",
        "56",
        "6d",
        "98",
        "83",
        "82",
        "99",
        "f5",
        "e0",
        "df",
        "f6",
    ]
    assert [f"0000:{b}:00.0" for b in buses] == list(TRN2_EFA_MAP)
    assert instance_spec("trn2.48xlarge").efa_map == TRN2_EFA_MAP
    assert instance_spec("trn2u.48xlarge").efa_map == TRN2_EFA_MAP


@pytest.mark.parametrize(
    "name", ["trn1.32xlarge", "trn1n.32xlarge", "inf2.48xlarge", "trn3.48xlarge"]
)
def test_instances_without_a_published_efa_map_have_none(name: str) -> None:
    assert instance_spec(name).efa_map is None


def test_trn2_logical_cores_follow_lnc() -> None:
    spec = instance_spec("trn2.48xlarge")
    assert spec.default_lnc == 2
    assert logical_cores_per_device(spec) == 4
    assert logical_cores_per_device(spec, 2) == 4
    assert logical_cores_per_device(spec, 1) == 8


def test_lnc_is_refused_where_the_instance_has_none() -> None:
    spec = instance_spec("inf2.48xlarge")
    assert spec.default_lnc is None
    assert logical_cores_per_device(spec) == 2
    with pytest.raises(ValueError, match=r"inf2\.48xlarge: logical NeuronCore config 2"):
        logical_cores_per_device(spec, 2)


def test_unsupported_lnc_value_names_the_instance() -> None:
    with pytest.raises(
        ValueError, match=r"trn2\.48xlarge: logical NeuronCore config 4 is not one of 1, 2"
    ):
        logical_cores_per_device(instance_spec("trn2.48xlarge"), 4)


@pytest.mark.parametrize(
    "name", ["trn3.48xlarge", "Trn3pds", "TRN3PDS.48xlarge", " trn3u.48xlarge "]
)
def test_trn3_name_variants_resolve(name: str) -> None:
    spec = instance_spec(name)
    assert spec.name == "trn3.48xlarge"
    assert spec.ultraserver_nodes == 4


def test_lookup_is_case_insensitive() -> None:
    assert instance_spec("Trn2.48xlarge").name == "trn2.48xlarge"


def test_unknown_instance_type_names_it() -> None:
    with pytest.raises(UnknownInstanceType, match=r"'p5.48xlarge' is not a Neuron instance type"):
        instance_spec("p5.48xlarge")
