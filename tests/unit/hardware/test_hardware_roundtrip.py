"""What the simulator writes, the real readers read back as the catalog describes it."""

from pathlib import Path

import msgspec
import pytest
from neuron_dra_common.hardware.model import NodeHardware
from neuron_dra_common.hardware.node import read_node
from neuron_dra_common.hardware.simulate import write_node
from neuron_dra_common.topology import (
    adjacency,
    catalog_instance_types,
    instance_spec,
    logical_cores_per_device,
)


@pytest.mark.parametrize("name", catalog_instance_types())
def test_every_instance_type_reads_back_as_the_catalog(tmp_path: Path, name: str) -> None:
    sim = write_node(tmp_path, instance_type=name, node_name="node-a", driver_version="2.25.1.0")
    # The real-command path: the simulated neuron-ls executable is run.
    hw = read_node(tmp_path, neuron_ls_command=sim.neuron_ls_command)
    spec = instance_spec(name)

    assert hw.problems == ()
    assert hw.instance_type == name
    assert hw.driver_version == "2.25.1.0"
    assert hw.default_lnc == spec.default_lnc
    assert [d.index for d in hw.devices] == list(range(spec.devices))
    links = adjacency(spec)
    for device in hw.devices:
        assert device.physical_cores == spec.physical_cores_per_device
        assert device.logical_cores == logical_cores_per_device(spec)
        assert device.memory_bytes == spec.memory_bytes_per_device
        assert device.connected_devices == links[device.index]
        assert device.arch is not None
        assert device.arch.arch_type == spec.arch_type
        assert device.arch.instance_type == spec.arch_instance_type
        assert device.arch.device_name == spec.device_name
        assert device.serial_number is not None
        assert device.bdf is not None
        assert device.numa_node is not None
        assert device.cpu_affinity is not None
        assert device.ecc.mem_uncorrected is not None
        assert device.ecc.mem_uncorrected.total == 0
        assert len(device.cores) == spec.physical_cores_per_device
    assert (hw.ultraserver is not None) == (spec.ultraserver_nodes > 1)


def test_reading_from_a_file_gives_the_same_node(tmp_path: Path) -> None:
    sim = write_node(tmp_path, instance_type="inf2.48xlarge", node_name="n")
    by_command = read_node(tmp_path, neuron_ls_command=sim.neuron_ls_command)
    by_file = read_node(tmp_path, neuron_ls_path=sim.neuron_ls_json)
    assert by_command == by_file


def test_torus_neighbours_read_back_in_driver_order(tmp_path: Path) -> None:
    sim = write_node(tmp_path, instance_type="trn2.48xlarge", node_name="n")
    raw = (tmp_path / "sys/class/neuron_device/neuron0/connected_devices").read_text()
    assert raw == "12, 3, 4, 1\n"
    hw = read_node(tmp_path, neuron_ls_command=sim.neuron_ls_command)
    assert hw.devices[0].connected_devices == (12, 3, 4, 1)
    assert hw.devices[5].connected_devices == (1, 4, 9, 6)


def test_core_count_has_no_newline_and_single_devices_list_nothing(tmp_path: Path) -> None:
    write_node(tmp_path, instance_type="inf2.xlarge", node_name="n")
    device = tmp_path / "sys/class/neuron_device/neuron0"
    assert (device / "core_count").read_text() == "2"
    assert (device / "connected_devices").read_text() == "\n"


def test_lnc_one_doubles_logical_cores(tmp_path: Path) -> None:
    sim = write_node(tmp_path, instance_type="trn2.48xlarge", node_name="n", lnc=1)
    text = (tmp_path / "opt/aws/neuron/logical_nc_config").read_text()
    assert text == "NEURON_LOGICAL_NC_CONFIG=1\n"
    hw = read_node(tmp_path, neuron_ls_command=sim.neuron_ls_command)
    assert hw.default_lnc == 1
    assert {d.logical_cores for d in hw.devices} == {8}


def test_lnc_on_an_instance_without_it_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"inf2\.48xlarge: logical NeuronCore config 2"):
        write_node(tmp_path, instance_type="inf2.48xlarge", node_name="n", lnc=2)


def test_neuron_ls_lists_global_core_ids_and_string_numa(tmp_path: Path) -> None:
    sim = write_node(tmp_path, instance_type="trn2.48xlarge", node_name="n")
    listing = msgspec.json.decode(sim.neuron_ls_json.read_bytes())
    assert listing[3]["neuroncore_ids"] == [12, 13, 14, 15]
    assert listing[3]["nc_count"] == 4
    assert listing[3]["logical_neuroncore_config"] == 2
    assert listing[3]["memory_size"] == 103079215104
    assert listing[3]["numa_node"] == "0"
    assert listing[12]["numa_node"] == "1"


def test_output_is_deterministic_per_seed(tmp_path: Path) -> None:
    def snapshot(root: Path) -> dict[str, bytes]:
        return {
            str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
        }

    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        write_node(tmp_path / name, instance_type="trn2u.48xlarge", node_name="n", seed=seed)
    assert snapshot(tmp_path / "a") == snapshot(tmp_path / "b")
    assert snapshot(tmp_path / "a") != snapshot(tmp_path / "c")


def test_node_hardware_survives_the_event_encoding(tmp_path: Path) -> None:
    sim = write_node(tmp_path, instance_type="trn2u.48xlarge", node_name="n")
    hw = read_node(tmp_path, neuron_ls_command=sim.neuron_ls_command)
    assert msgspec.json.decode(msgspec.json.encode(hw), type=NodeHardware) == hw


def test_writing_a_node_again_repairs_what_changed_and_leaves_the_rest(tmp_path: Path) -> None:
    """The stack writes every node's hardware at each start: an injected fault (a counter,
    a changed file) is gone afterwards, and unchanged files are not written again."""
    write_node(tmp_path, instance_type="trn2.48xlarge", node_name="node-a")
    counter = tmp_path / "sys/class/neuron_device/neuron0/stats/hardware"
    faulted = next(counter.glob("*/total"))
    faulted.write_text("3\n")
    untouched = tmp_path / "sys/class/neuron_device/neuron1/connected_devices"
    before = untouched.stat().st_mtime_ns
    first = (tmp_path / "sys/class/neuron_device/neuron0/connected_devices").read_text()

    sim = write_node(tmp_path, instance_type="trn2.48xlarge", node_name="node-a")
    assert faulted.read_text() == "0\n"
    assert untouched.stat().st_mtime_ns == before
    assert (tmp_path / "sys/class/neuron_device/neuron0/connected_devices").read_text() == first
    assert read_node(tmp_path, neuron_ls_command=sim.neuron_ls_command).problems == ()
