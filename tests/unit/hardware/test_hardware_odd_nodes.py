"""Odd or partial hardware is reported, never a crash, and never silently dropped."""

import logging
from pathlib import Path

import pytest
from neuron_dra_common.hardware.files import ProblemLog, read_small
from neuron_dra_common.hardware.model import HardwareProblem, NodeHardware
from neuron_dra_common.hardware.node import read_node
from neuron_dra_common.hardware.simulate import write_counter, write_node

DEV = "sys/class/neuron_device"


def _problems_at(hw: NodeHardware, suffix: str) -> list[HardwareProblem]:
    return [p for p in hw.problems if p.path.endswith(suffix)]


def test_missing_optional_file_is_left_out_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sim = write_node(tmp_path, instance_type="trn2.48xlarge", node_name="n")
    (tmp_path / DEV / "neuron4/info/serial_number").unlink()
    with caplog.at_level(logging.WARNING):
        hw = read_node(tmp_path, neuron_ls_command=sim.neuron_ls_command)
    assert len(hw.devices) == 16
    assert hw.devices[4].serial_number is None
    assert hw.devices[3].serial_number is not None
    [problem] = _problems_at(hw, "neuron4/info/serial_number")
    assert problem == HardwareProblem(path=problem.path, reason="missing", device=4, fatal=False)
    [record] = [r for r in caplog.records if getattr(r, "device", None) == 4]
    assert record.__dict__["path"].endswith("neuron4/info/serial_number")
    assert record.__dict__["reason"] == "missing"


def test_garbage_in_a_counter_drops_only_that_counter(tmp_path: Path) -> None:
    sim = write_node(
        tmp_path,
        instance_type="trn2.48xlarge",
        node_name="n",
        garbage={f"{DEV}/neuron2/stats/hardware/mem_ecc_uncorrected/total": "lots\n"},
    )
    hw = read_node(tmp_path, neuron_ls_command=sim.neuron_ls_command)
    device = hw.devices[2]
    assert device.ecc.mem_uncorrected is None
    assert device.ecc.sram_uncorrected is not None
    [problem] = _problems_at(hw, "mem_ecc_uncorrected/total")
    assert "'lots'" in problem.reason
    assert problem.device == 2


def test_garbage_in_a_core_status_counter(tmp_path: Path) -> None:
    sim = write_node(
        tmp_path,
        instance_type="inf2.xlarge",
        node_name="n",
        garbage={f"{DEV}/neuron0/neuron_core1/stats/status/failure/present": "-\n"},
    )
    hw = read_node(tmp_path, neuron_ls_command=sim.neuron_ls_command)
    core = hw.devices[0].cores[1]
    assert "failure" not in core.counters
    assert "success" in core.counters
    assert _problems_at(hw, "neuron_core1/stats/status/failure/present")


def test_ecc_counters_read_back(tmp_path: Path) -> None:
    sim = write_node(tmp_path, instance_type="trn2.48xlarge", node_name="n")
    write_counter(tmp_path, device=7, counter="sram_ecc_uncorrected", total=3, present=1)
    hw = read_node(tmp_path, neuron_ls_command=sim.neuron_ls_command)
    counter = hw.devices[7].ecc.sram_uncorrected
    assert counter is not None
    assert (counter.total, counter.present) == (3, 1)


def test_missing_device_directory_is_reported_as_fatal(tmp_path: Path) -> None:
    sim = write_node(tmp_path, instance_type="trn2.48xlarge", node_name="n", missing_devices=[9])
    hw = read_node(tmp_path, neuron_ls_command=sim.neuron_ls_command)
    assert [d.index for d in hw.devices] == [i for i in range(16) if i != 9]
    fatal = [p for p in hw.problems if p.fatal]
    assert [(p.device, p.reason) for p in fatal] == [(9, "device directory missing")]
    assert any("16 devices, 15 usable" in p.reason for p in hw.problems)
    # neuron-ls still lists it: that disagreement is reported too.
    assert any(p.device == 9 and "neuron-ls" in p.reason for p in hw.problems)


def test_missing_dev_node_is_reported(tmp_path: Path) -> None:
    sim = write_node(tmp_path, instance_type="inf2.24xlarge", node_name="n")
    (tmp_path / "dev/neuron5").unlink()
    hw = read_node(tmp_path, neuron_ls_command=sim.neuron_ls_command)
    assert len(hw.devices) == 5
    [problem] = [p for p in hw.problems if p.fatal]
    assert problem.path.endswith("dev/neuron5")
    assert problem.reason == "device node missing"


def test_unreadable_file_is_reported(tmp_path: Path) -> None:
    sim = write_node(
        tmp_path,
        instance_type="trn1.32xlarge",
        node_name="n",
        unreadable=[f"{DEV}/neuron0/core_count", "sys/module/neuron/version"],
    )
    hw = read_node(tmp_path, neuron_ls_command=sim.neuron_ls_command)
    assert hw.devices[0].physical_cores is None
    assert hw.devices[1].physical_cores == 2
    assert hw.driver_version is None
    [core] = _problems_at(hw, "neuron0/core_count")
    assert core.reason.startswith("unreadable: IsADirectoryError")
    assert _problems_at(hw, "sys/module/neuron/version")


def test_garbage_connected_devices(tmp_path: Path) -> None:
    sim = write_node(
        tmp_path,
        instance_type="trn2.48xlarge",
        node_name="n",
        garbage={f"{DEV}/neuron0/connected_devices": "12, x\n"},
    )
    hw = read_node(tmp_path, neuron_ls_command=sim.neuron_ls_command)
    # sysfs could not say; neuron-ls's connected_to fills in.
    assert hw.devices[0].connected_devices == (12, 3, 4, 1)
    assert _problems_at(hw, "neuron0/connected_devices")


def test_bad_lnc_file(tmp_path: Path) -> None:
    sim = write_node(
        tmp_path,
        instance_type="trn2.48xlarge",
        node_name="n",
        garbage={"opt/aws/neuron/logical_nc_config": "NEURON_LOGICAL_NC_CONFIG=3\n"},
    )
    hw = read_node(tmp_path, neuron_ls_command=sim.neuron_ls_command)
    [problem] = _problems_at(hw, "logical_nc_config")
    assert "NEURON_LOGICAL_NC_CONFIG 3 is not 1 or 2" in problem.reason
    # neuron-ls still says which config the devices run.
    assert hw.default_lnc == 2


def test_missing_neuron_ls_keeps_sysfs_facts(tmp_path: Path) -> None:
    write_node(tmp_path, instance_type="inf2.48xlarge", node_name="n")
    hw = read_node(tmp_path, neuron_ls_command=[str(tmp_path / "no-such-neuron-ls"), "-j"])
    assert len(hw.devices) == 12
    assert hw.devices[0].physical_cores == 2
    assert hw.devices[0].memory_bytes is None
    assert any(p.reason == "command not found" for p in hw.problems)


def test_failing_neuron_ls_is_reported(tmp_path: Path) -> None:
    sim = write_node(tmp_path, instance_type="inf2.xlarge", node_name="n")
    hw = read_node(tmp_path, neuron_ls_command=[sim.neuron_ls_command[0], "--bogus"])
    assert any(p.reason.startswith("exit status 2: usage") for p in hw.problems)


def test_unknown_product_name_is_reported(tmp_path: Path) -> None:
    sim = write_node(
        tmp_path,
        instance_type="trn2.48xlarge",
        node_name="n",
        garbage={"sys/class/dmi/id/product_name": "m7i.large\n"},
    )
    hw = read_node(tmp_path, neuron_ls_command=sim.neuron_ls_command)
    assert hw.instance_type == "m7i.large"
    assert any("'m7i.large' is not a Neuron instance type" in p.reason for p in hw.problems)
    override = read_node(
        tmp_path, neuron_ls_command=sim.neuron_ls_command, instance_type="trn2.48xlarge"
    )
    assert override.instance_type == "trn2.48xlarge"
    assert override.problems == ()


def test_empty_root_reads_as_a_node_without_devices(tmp_path: Path) -> None:
    hw = read_node(tmp_path, neuron_ls_path=tmp_path / "none.json")
    assert hw.devices == ()
    assert hw.instance_type == ""
    assert any(p.fatal and "instance type unknown" in p.reason for p in hw.problems)


@pytest.mark.parametrize("size", [0, 5, 4095, 4096, 4097, 20_000])
def test_a_driver_file_is_read_whole_whatever_its_length(tmp_path: Path, size: int) -> None:
    """Files are read with one read of a page; a longer one is read on to its end."""
    text = ("0123456789abcde\n" * (size // 16 + 1))[:size]
    (tmp_path / "value").write_text(text)
    assert read_small(tmp_path / "value") == text
    assert read_small(str(tmp_path / "value")) == text


def test_an_unreadable_driver_file_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    (tmp_path / "garbage").write_bytes(b"\xff\xfe\n")
    problems = ProblemLog()
    assert problems.text(tmp_path / "garbage", device=1) is None
    assert problems.text(f"{tmp_path}/absent", device=1) is None
    [garbage, absent] = problems.items
    assert garbage.reason.startswith("unreadable: UnicodeDecodeError")
    assert (absent.path, absent.reason) == (f"{tmp_path}/absent", "missing")
