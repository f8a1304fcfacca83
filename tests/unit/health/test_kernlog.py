"""Reading the driver's kernel log lines and /dev/kmsg records."""

from __future__ import annotations

import pytest
from neuron_dra_common.hardware.kernlog import (
    KernelLineError,
    format_hw_error,
    parse_hw_error,
    parse_kmsg,
)

LINE = (
    "NEURON_HW_ERR=SRAM_UNCORRECTABLE_ERROR instance-id=i-0123456789abcdef0 "
    "hostname=ip-10-0-1-2.ec2.internal nd-id=7 nc-id=3 serial-num=5f2a9c01d4e3b2a1 "
    "action=TERMINATE_INSTANCE"
)


def test_a_driver_line_names_type_device_core_and_action() -> None:
    error = parse_hw_error(f"Nov 25 15:00:01 ip-10-0-1-2 kernel: [ 812.001] {LINE}")
    assert error is not None
    assert (error.error_type, error.device, error.core) == ("SRAM_UNCORRECTABLE_ERROR", 7, 3)
    assert error.action == "TERMINATE_INSTANCE"
    assert error.serial_number == "5f2a9c01d4e3b2a1"
    assert error.line == LINE


def test_other_lines_are_not_errors() -> None:
    assert parse_hw_error("kernel: neuron: driver loaded, version 2.24.7.0") is None


def test_a_line_without_core_has_none() -> None:
    error = parse_hw_error(
        "NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR nd-id=0 action=TERMINATE_INSTANCE"
    )
    assert error is not None
    assert error.core is None


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("NEURON_HW_ERR=DMA_ERROR nc-id=1", "nd-id is not a device number"),
        ("NEURON_HW_ERR=DMA_ERROR nd-id=x", "nd-id is not a device number"),
        ("NEURON_HW_ERR= nd-id=1", "no error type"),
    ],
)
def test_a_broken_error_line_is_refused_naming_the_line(line: str, says: str) -> None:
    with pytest.raises(KernelLineError, match=says) as info:
        parse_hw_error(line)
    assert "NEURON_HW_ERR=" in str(info.value)


def test_kmsg_record_fields_and_continuation_lines() -> None:
    record = parse_kmsg(f"3,4711,812001234,-;{LINE}\n SUBSYSTEM=pci\n DEVICE=+pci:0000:20:00.0\n")
    assert (record.facility, record.level) == (0, 3)
    assert record.sequence == 4711
    assert record.timestamp_us == 812001234
    assert record.message == LINE


def test_kmsg_prefix_carries_facility_and_level() -> None:
    record = parse_kmsg("14,1,2,-;user message")  # facility 1 (user), level 6 (info)
    assert (record.facility, record.level) == (1, 6)


def test_kmsg_escaped_bytes_are_decoded() -> None:
    assert parse_kmsg("6,1,2,-;tab\\x09here").message == "tab\there"


@pytest.mark.parametrize("raw", ["no separator", "6,1;short head", "x,1,2,-;bad prefix"])
def test_a_broken_kmsg_record_is_refused(raw: str) -> None:
    with pytest.raises(ValueError, match="kmsg record"):
        parse_kmsg(raw)


def test_the_simulator_line_reads_back() -> None:
    line = format_hw_error(
        error_type="NC_UNCORRECTABLE_ERROR",
        device=12,
        core=5,
        instance_id="i-1",
        hostname="n1",
        serial_number="ab",
    )
    error = parse_hw_error(line)
    assert error is not None
    assert (error.error_type, error.device, error.core) == ("NC_UNCORRECTABLE_ERROR", 12, 5)
