"""Parsing neuron-ls -j output, including what real tools print oddly."""

from neuron_dra_common.hardware.neuronls import parse_neuron_ls

ENTRY = (
    '{"neuron_device": 1, "bdf": "0000:24:00.0", "cpu_affinity": "0-47,96-143", '
    '"numa_node": "0", "connected_to": [0, 2], "nc_count": 4, '
    '"logical_neuroncore_config": 2, "memory_size": 103079215104, '
    '"neuroncore_ids": [4, 5, 6, 7], "neuron_processes": [{"pid": 4242, "command": "python"}]}'
)


def test_fields_are_read() -> None:
    result = parse_neuron_ls(f"[{ENTRY}]")
    assert result.problems == ()
    [device] = result.devices
    assert device.neuron_device == 1
    assert device.numa_node == 0
    assert device.connected_to == (0, 2)
    assert device.nc_count == 4
    assert device.memory_size == 103079215104
    assert device.neuroncore_ids == (4, 5, 6, 7)
    assert device.process_pids == (4242,)


def test_null_connected_to_and_absent_lnc() -> None:
    result = parse_neuron_ls('[{"neuron_device": 0, "connected_to": null, "numa_node": "-1"}]')
    assert result.problems == ()
    [device] = result.devices
    assert device.connected_to == ()
    assert device.logical_neuroncore_config is None
    assert device.numa_node == -1


def test_entry_without_index_is_reported_and_others_kept() -> None:
    result = parse_neuron_ls(f'[{{"bdf": "x"}}, {ENTRY}, 7]')
    assert [d.neuron_device for d in result.devices] == [1]
    reasons = [(p.path, p.reason) for p in result.problems]
    assert reasons == [
        ("neuron-ls -j[0]", "neuron_device None is not a device index"),
        ("neuron-ls -j[2]", "expected an object, got int"),
    ]


def test_odd_field_is_left_out() -> None:
    result = parse_neuron_ls('[{"neuron_device": 3, "numa_node": "zero", "nc_count": true}]')
    [device] = result.devices
    assert device.numa_node is None
    assert device.nc_count is None
    assert {p.path for p in result.problems} == {
        "neuron-ls -j[0].numa_node",
        "neuron-ls -j[0].nc_count",
    }
    assert all(p.device == 3 for p in result.problems)


def test_not_json() -> None:
    result = parse_neuron_ls("neuron-ls: no devices", source="cmd")
    assert result.devices == ()
    assert result.problems[0].path == "cmd"
    assert result.problems[0].reason.startswith("not JSON")


def test_duplicate_device_keeps_the_first() -> None:
    result = parse_neuron_ls(f"[{ENTRY}, {ENTRY}]")
    assert len(result.devices) == 1
    assert result.problems[0].reason == "device listed twice; first entry kept"
