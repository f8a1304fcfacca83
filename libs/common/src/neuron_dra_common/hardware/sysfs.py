"""Reading the Neuron driver's sysfs tree, ``/dev`` nodes and node-level files.

:func:`read_sysfs` never raises on odd hardware. An optional value that cannot be read is
logged, reported as a non-fatal :class:`HardwareProblem` and left out (``None``); a device
whose sysfs directory or ``/dev`` node is missing is reported as a fatal problem for that
device and is not described.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import msgspec

from neuron_dra_common.hardware.files import ProblemLog, parse_int, parse_int_list
from neuron_dra_common.hardware.layout import ECC_COUNTERS, MAX_DEVICES, NodePaths
from neuron_dra_common.hardware.model import (
    ArchInfo,
    CoreStatus,
    Counter,
    EccCounters,
    HardwareProblem,
    NeuronDevice,
    UltraServerInfo,
)

__all__ = ["SysfsNode", "parse_lnc_config", "read_sysfs"]

_NEURON_NAME = re.compile(r"neuron(\d+)")
_CORE_NAME = re.compile(r"neuron_core(\d+)")
_SERVER_ID = re.compile(r"[0-9a-fA-F]{16}")
_BUSY = "busy"


class SysfsNode(msgspec.Struct, frozen=True, kw_only=True):
    """What the files of one node say, before ``neuron-ls`` adds its part."""

    product_name: str | None = None
    driver_version: str | None = None
    lnc: int | None = None
    devices: tuple[NeuronDevice, ...] = ()
    ultraserver: UltraServerInfo | None = None
    problems: tuple[HardwareProblem, ...] = ()


def parse_lnc_config(raw: str) -> int:
    """The value of ``NEURON_LOGICAL_NC_CONFIG=<n>`` in the node's LNC file.

    >>> parse_lnc_config("NEURON_LOGICAL_NC_CONFIG=1\\n")
    1
    """
    for line in raw.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key.strip() == "NEURON_LOGICAL_NC_CONFIG":
            lnc = int(value.strip().strip("\"'"), 10)
            if lnc not in (1, 2):
                raise ValueError(f"NEURON_LOGICAL_NC_CONFIG {lnc} is not 1 or 2")
            return lnc
    raise ValueError("no NEURON_LOGICAL_NC_CONFIG= line")


def read_sysfs(root: Path = Path("/")) -> SysfsNode:
    """Read the node-level files, every device and the UltraServer files under ``root``."""
    paths = NodePaths(root)
    problems = ProblemLog()
    product = problems.value(paths.product_name, str)
    version = problems.value(paths.driver_version, str)
    lnc = problems.value(paths.lnc_config, parse_lnc_config) if paths.lnc_config.exists() else None
    devices = tuple(
        device
        for index in _device_indices(paths, problems)
        if (device := _read_device(paths, index, problems)) is not None
    )
    return SysfsNode(
        product_name=product or None,
        driver_version=version or None,
        lnc=lnc,
        devices=devices,
        ultraserver=_read_ultraserver(paths, problems),
        problems=problems.items,
    )


def _indices_in(directory: Path, problems: ProblemLog) -> set[int]:
    try:
        names = [p.name for p in directory.iterdir()]
    except FileNotFoundError:
        return set()
    except OSError as exc:
        problems.add(directory, f"cannot list: {exc}", fatal=True)
        return set()
    return {int(m.group(1)) for name in names if (m := _NEURON_NAME.fullmatch(name))}


def _device_indices(paths: NodePaths, problems: ProblemLog) -> list[int]:
    """Devices seen in ``/dev`` or in sysfs; one seen in only one place is reported."""
    in_dev = _indices_in(paths.dev, problems)
    in_sysfs = {i for i in _indices_in(paths.neuron_class, problems) if paths.device(i).is_dir()}
    usable: list[int] = []
    for index in sorted(in_dev | in_sysfs):
        if index >= MAX_DEVICES:
            problems.add(
                paths.dev_node(index),
                f"device index beyond the driver's {MAX_DEVICES} devices",
                device=index,
                fatal=True,
            )
        elif index not in in_sysfs:
            problems.add(paths.device(index), "device directory missing", device=index, fatal=True)
        elif index not in in_dev:
            problems.add(paths.dev_node(index), "device node missing", device=index, fatal=True)
        else:
            usable.append(index)
    return usable


def _read_device(paths: NodePaths, index: int, problems: ProblemLog) -> NeuronDevice | None:
    base = paths.device(index)
    try:
        base.stat()
    except OSError as exc:
        problems.add(base, f"cannot read device directory: {exc}", device=index, fatal=True)
        return None
    connected_raw = problems.text(base / "connected_devices", device=index)
    connected: tuple[int, ...] = ()
    if connected_raw is not None:
        try:
            connected = parse_int_list(connected_raw)
        except ValueError as exc:
            problems.add(
                base / "connected_devices",
                f"unexpected content {connected_raw.strip()[:64]!r}: {exc}",
                device=index,
            )
    serial = problems.value(base / "info" / "serial_number", str, device=index)
    return NeuronDevice(
        index=index,
        physical_cores=problems.value(base / "core_count", parse_int, device=index),
        connected_devices=connected,
        serial_number=serial or None,
        arch=_read_arch(base / "info" / "architecture", index, problems),
        ecc=_read_ecc(base / "stats" / "hardware", index, problems),
        cores=_read_cores(base, index, problems),
    )


def _read_arch(directory: Path, index: int, problems: ProblemLog) -> ArchInfo | None:
    if not directory.is_dir():
        problems.add(directory, "missing", device=index)
        return None
    fields = {
        name: problems.value(directory / name, str, device=index) or None
        for name in ("arch_type", "instance_type", "device_name")
    }
    return ArchInfo(**fields)


def _read_ecc(directory: Path, index: int, problems: ProblemLog) -> EccCounters:
    counters = {
        field: problems.counter(f"{directory}/{name}", device=index)
        for field, name in ECC_COUNTERS.items()
    }
    return EccCounters(**counters)


def _read_cores(base: Path, index: int, problems: ProblemLog) -> tuple[CoreStatus, ...]:
    try:
        with os.scandir(base) as entries:
            core_ids = sorted(
                int(m.group(1)) for e in entries if (m := _CORE_NAME.fullmatch(e.name))
            )
    except OSError as exc:
        problems.add(base, f"cannot list cores: {exc}", device=index)
        return ()
    cores: list[CoreStatus] = []
    for core in core_ids:
        status = f"{base}/neuron_core{core}/stats/status"
        counters: dict[str, Counter] = {}
        try:
            # The directory's own entry types: no stat per counter.
            with os.scandir(status) as entries:
                names = sorted(e.name for e in entries if e.is_dir())
        except OSError as exc:
            problems.add(status, f"cannot list status counters: {exc}", device=index)
            names = []
        for name in names:
            counter = problems.counter(f"{status}/{name}", device=index)
            if counter is not None:
                counters[name] = counter
        cores.append(CoreStatus(index=core, counters=counters))
    return tuple(cores)


_ULTRASERVER_FILES = (
    "server_id_2",
    "server_id_4",
    "node_id_2",
    "node_id_4",
    "ultraserver_mode",
    "reservation_id",
    "node_id",
)


def _parse_server_id(raw: str) -> str:
    if not _SERVER_ID.fullmatch(raw):
        raise ValueError("not 16 hex characters")
    return raw.lower()


def _parse_node_id(raw: str) -> int | str:
    return _BUSY if raw == _BUSY else int(raw, 10)


def _read_ultraserver(paths: NodePaths, problems: ProblemLog) -> UltraServerInfo | None:
    """Class-level UltraServer files; ``None`` on nodes that have none of them."""
    present = [name for name in _ULTRASERVER_FILES if paths.class_file(name).exists()]
    if not present:
        return None

    busy_reasons: list[tuple[Path, str]] = []
    server_ids: dict[int, str | None] = {}
    node_ids: dict[int, int | None] = {}
    for size in (2, 4):
        sid_path = paths.class_file(f"server_id_{size}")
        nid_path = paths.class_file(f"node_id_{size}")
        if not sid_path.exists() and not nid_path.exists():
            server_ids[size] = node_ids[size] = None
            continue
        sid = problems.value(sid_path, _parse_server_id)
        nid = problems.value(nid_path, _parse_node_id)
        if nid == _BUSY:
            busy_reasons.append((nid_path, "node id reads 'busy': UltraServer election running"))
            nid = None
        if sid is not None and set(sid) == {"0"}:
            if nid != -1:
                busy_reasons.append(
                    (sid_path, "server id is all zeros: UltraServer election running")
                )
            sid = None
        server_ids[size] = sid
        node_ids[size] = nid if isinstance(nid, int) else None

    modes: tuple[int, ...] = ()
    mode_path = paths.class_file("ultraserver_mode")
    if mode_path.exists():
        modes = problems.value(mode_path, parse_int_list) or ()
    reservation: str | None = None
    trn3_node: int | None = None
    if paths.class_file("reservation_id").exists():
        reservation = problems.value(paths.class_file("reservation_id"), str) or None
    node_path = paths.class_file("node_id")
    if node_path.exists():
        raw_node = problems.value(node_path, _parse_node_id)
        if raw_node == _BUSY:
            busy_reasons.append((node_path, "node id reads 'busy': UltraServer election running"))
        elif isinstance(raw_node, int):
            trn3_node = raw_node
    for path, reason in busy_reasons:
        problems.add(path, reason)
    return UltraServerInfo(
        server_id_2=server_ids[2],
        server_id_4=server_ids[4],
        node_id_2=node_ids[2],
        node_id_4=node_ids[4],
        election_busy=bool(busy_reasons),
        supported_modes=modes,
        reservation_id=reservation,
        node_id=trn3_node,
    )
