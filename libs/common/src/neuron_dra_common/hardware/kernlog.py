"""The kernel log as the Neuron driver writes to it (no I/O); the probe parses it, the
simulator writes it.

The driver reports an uncorrectable hardware error with one kernel log line::

    NEURON_HW_ERR=SRAM_UNCORRECTABLE_ERROR instance-id=i-0abc hostname=ip-10-0-0-1
        nd-id=3 nc-id=1 serial-num=5f2a... action=TERMINATE_INSTANCE

``nd-id`` is the Neuron device (``/dev/neuron3``), ``nc-id`` the NeuronCore on it. On a node
the probe reads ``/dev/kmsg``, whose records are ``<prefix>,<seq>,<usec>,<flags>;<message>``
(the prefix is the syslog priority, facility * 8 + level) followed by optional continuation
lines that start with a space; a text log (``/var/log/kern.log``, a simulated node's log)
carries the same message somewhere in each line.
"""

from __future__ import annotations

from typing import Final

import msgspec

__all__ = [
    "HW_ERROR_MARKER",
    "KERNEL_ERROR_TYPES",
    "KernelHwError",
    "KernelLineError",
    "KmsgRecord",
    "format_hw_error",
    "parse_hw_error",
    "parse_kmsg",
]

HW_ERROR_MARKER: Final = "NEURON_HW_ERR="

#: The error types the driver writes after ``NEURON_HW_ERR=``.
KERNEL_ERROR_TYPES: Final = frozenset(
    {
        "SRAM_UNCORRECTABLE_ERROR",
        "NC_UNCORRECTABLE_ERROR",
        "HBM_UNCORRECTABLE_ERROR",
        "DMA_ERROR",
    }
)


class KernelLineError(ValueError):
    """A ``NEURON_HW_ERR=`` line the probe cannot use; the message quotes the line."""


class KmsgRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One ``/dev/kmsg`` record."""

    facility: int
    level: int
    sequence: int
    timestamp_us: int
    message: str


class KernelHwError(msgspec.Struct, frozen=True, kw_only=True):
    """One ``NEURON_HW_ERR=`` report: which error on which device (and core)."""

    error_type: str
    device: int
    core: int | None = None
    action: str = ""
    serial_number: str = ""
    line: str = ""


def parse_kmsg(record: str) -> KmsgRecord:
    """One ``/dev/kmsg`` record (continuation lines dropped).

    >>> parse_kmsg("3,1024,5012345,-;neuron: hello\\n SUBSYSTEM=pci").message
    'neuron: hello'
    """
    first = record.split("\n", 1)[0]
    head, sep, message = first.partition(";")
    fields = head.split(",")
    if not sep or len(fields) < 4:
        raise ValueError(f"kmsg record {first[:80]!r}: expected 'prefix,seq,usec,flags;message'")
    try:
        prefix, sequence, usec = int(fields[0]), int(fields[1]), int(fields[2])
    except ValueError:
        raise ValueError(
            f"kmsg record {first[:80]!r}: prefix, seq and usec must be integers"
        ) from None
    return KmsgRecord(
        facility=prefix >> 3,
        level=prefix & 7,
        sequence=sequence,
        timestamp_us=usec,
        message=_unescape(message),
    )


def _unescape(message: str) -> str:
    # The kernel writes non-printable bytes of a message as \xNN.
    if "\\x" not in message:
        return message
    return message.encode("latin-1", "backslashreplace").decode("unicode_escape")


def parse_hw_error(line: str) -> KernelHwError | None:
    """The Neuron hardware error a log line reports; ``None`` for any other line.

    Raises :class:`KernelLineError` for a ``NEURON_HW_ERR=`` line without a usable device.

    >>> e = parse_hw_error("kernel: NEURON_HW_ERR=DMA_ERROR nd-id=2 nc-id=0 action=TERMINATE_INSTANCE")
    >>> e.error_type, e.device, e.core
    ('DMA_ERROR', 2, 0)
    """
    at = line.find(HW_ERROR_MARKER)
    if at < 0:
        return None
    text = line[at:].strip()
    fields: dict[str, str] = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if sep:
            fields[key] = value
    error_type = fields.get("NEURON_HW_ERR", "")
    if not error_type:
        raise KernelLineError(f"kernel line {text[:200]!r}: NEURON_HW_ERR has no error type")
    device = _int(fields.get("nd-id"))
    if device is None or device < 0:
        raise KernelLineError(f"kernel line {text[:200]!r}: nd-id is not a device number")
    core = _int(fields.get("nc-id"))
    return KernelHwError(
        error_type=error_type,
        device=device,
        core=core if core is not None and core >= 0 else None,
        action=fields.get("action", ""),
        serial_number=fields.get("serial-num", ""),
        line=text,
    )


def _int(raw: str | None) -> int | None:
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        return None


def format_hw_error(
    *,
    error_type: str,
    device: int,
    core: int | None,
    instance_id: str,
    hostname: str,
    serial_number: str,
    action: str = "TERMINATE_INSTANCE",
) -> str:
    """The line the driver writes for one error (what the simulator writes).

    >>> format_hw_error(error_type="DMA_ERROR", device=1, core=None, instance_id="i-1",
    ...                 hostname="h", serial_number="ab")
    'NEURON_HW_ERR=DMA_ERROR instance-id=i-1 hostname=h nd-id=1 serial-num=ab action=TERMINATE_INSTANCE'
    """
    parts = [
        f"{HW_ERROR_MARKER}{error_type}",
        f"instance-id={instance_id}",
        f"hostname={hostname}",
        f"nd-id={device}",
    ]
    if core is not None:
        parts.append(f"nc-id={core}")
    parts += [f"serial-num={serial_number}", f"action={action}"]
    return " ".join(parts)
