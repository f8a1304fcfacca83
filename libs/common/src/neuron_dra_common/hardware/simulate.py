"""Simulated Neuron hardware: the files a real node shows, written under a directory.

:func:`write_node` writes, for any catalog instance type, ``/dev/neuronN`` placeholders, the
driver's sysfs tree (per-device files, ECC counters, per-core status counters, architecture,
serial numbers, class-level UltraServer files), the driver version, the DMI product name, the
node's LNC file, ``neuron-ls -j`` output and a small executable ``neuron-ls`` that prints it.
The real discovery code then reads it as it reads a node. Output depends only on the arguments
(``seed`` and ``node_name`` drive serial numbers and counters).

Knobs for odd hardware: ``missing_devices`` (sysfs directory gone, ``/dev`` node kept),
``unreadable`` (a file replaced by a directory, which fails to read even as root) and
``garbage`` (a file's content replaced), all with paths relative to ``root``; an UltraServer
election in progress is ``SimUltraServer(election_busy=True)``.

:func:`inject_fault` makes a written node fail as a real one does: the driver's
``NEURON_HW_ERR=`` line in the node's kernel log (``var/log/kern.log`` under the root), the
matching counter going up, a NeuronLink dropping out of ``connected_devices``; ``repair``
does what a driver reload does (the device's sysfs directory made anew, counters at zero,
links back).
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import stat
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

import msgspec

from neuron_dra_common.hardware.kernlog import format_hw_error
from neuron_dra_common.hardware.layout import ECC_COUNTERS, NodePaths
from neuron_dra_common.topology.adjacency import adjacency
from neuron_dra_common.topology.catalog import (
    InstanceSpec,
    instance_spec,
    logical_cores_per_device,
)

__all__ = [
    "CORE_STATUS_COUNTERS",
    "DEFAULT_DRIVER_VERSION",
    "FAULTS",
    "FaultError",
    "SimNode",
    "SimUltraServer",
    "inject_fault",
    "ultraserver_members",
    "write_counter",
    "write_node",
]

DEFAULT_DRIVER_VERSION = "2.24.7.0"

#: Status counters written per NeuronCore.
CORE_STATUS_COUNTERS = ("success", "failure", "timeout", "exec_bad_input", "hw_error")

_ZERO_ID = "0" * 16
_VCPUS = {"xlarge": 4, "2xlarge": 8, "6xlarge": 24, "8xlarge": 32, "24xlarge": 96}
_VCPUS |= {"32xlarge": 128, "48xlarge": 192}

_NEURON_LS_SCRIPT = """#!/bin/sh
# Simulated neuron-ls: prints this node's device list for -j.
here=$(cd "$(dirname "$0")" && pwd)
if [ "$1" = "-j" ] || [ "$1" = "--json-output" ]; then
    exec cat "$here/../neuron-ls.json"
fi
echo "usage: neuron-ls -j" >&2
exit 2
"""


class SimUltraServer(msgspec.Struct, frozen=True, kw_only=True):
    """The class-level UltraServer files of one simulated node.

    Trn2 UltraServers use the server and node ids by size; Trn3 uses ``reservation_id`` and
    ``node_id``. ``election_busy`` writes what the driver shows mid-election: node ids
    ``busy``, server ids all zeros. The defaults describe a node that is in no UltraServer.
    """

    server_id_2: str = _ZERO_ID
    server_id_4: str = _ZERO_ID
    node_id_2: int = -1
    node_id_4: int = -1
    supported_modes: tuple[int, ...] = (4,)
    election_busy: bool = False
    reservation_id: str | None = None
    node_id: int = -1


class SimNode(msgspec.Struct, frozen=True, kw_only=True):
    """Where a simulated node was written, and how to run its ``neuron-ls``."""

    root: Path
    instance_type: str
    node_name: str
    neuron_ls_command: tuple[str, ...]
    neuron_ls_json: Path


def ultraserver_members(*, index: int, seed: int = 0) -> tuple[SimUltraServer, ...]:
    """The four nodes of simulated UltraServer ``index``, by ``node_id_4``.

    All four share ``server_id_4`` (and, for Trn3, ``reservation_id``); the vertical pairs
    ``{0, 1}`` and ``{2, 3}`` share a ``server_id_2``. Every mode is supported.
    """
    server4 = _hex_id(f"{seed}/ultraserver/{index}/4")
    members: list[SimUltraServer] = []
    for node in range(4):
        members.append(
            SimUltraServer(
                server_id_2=_hex_id(f"{seed}/ultraserver/{index}/2/{node // 2}"),
                server_id_4=server4,
                node_id_2=node % 2,
                node_id_4=node,
                supported_modes=(1, 2, 3, 4),
                reservation_id=server4,
                node_id=node,
            )
        )
    return tuple(members)


def write_node(
    root: Path,
    *,
    instance_type: str,
    node_name: str,
    driver_version: str = DEFAULT_DRIVER_VERSION,
    lnc: int | None = None,
    ultraserver: SimUltraServer | None = None,
    seed: int = 0,
    missing_devices: Iterable[int] = (),
    unreadable: Iterable[str] = (),
    garbage: Mapping[str, str] | None = None,
) -> SimNode:
    """Write the hardware of one ``instance_type`` node under ``root``.

    ``instance_type`` is written as the DMI product name as given (so name variants such as
    ``Trn3pds`` can be simulated). ``lnc`` writes the node's LNC file; without it the instance
    default applies. ``ultraserver`` is only allowed on UltraServer instance types; there,
    without it, the node is in no UltraServer.

    >>> import tempfile
    >>> node = write_node(Path(tempfile.mkdtemp()), instance_type="trn2.48xlarge", node_name="n1")
    >>> (node.root / "sys/class/neuron_device/neuron0/connected_devices").read_text()
    '12, 3, 4, 1\\n'
    """
    spec = instance_spec(instance_type)
    if ultraserver is not None and spec.ultraserver_nodes == 1:
        raise ValueError(f"instance type {spec.name} is not an UltraServer node: ultraserver given")
    logical = logical_cores_per_device(spec, lnc)
    paths = NodePaths(root)
    rng = random.Random(f"{seed}/{node_name}")

    _write(paths.product_name, f"{instance_type}\n")
    _write(paths.driver_version, f"{driver_version}\n")
    if lnc is not None:
        _write(paths.lnc_config, f"NEURON_LOGICAL_NC_CONFIG={lnc}\n")
    links = adjacency(spec)
    for index in range(spec.devices):
        _write(paths.dev_node(index), "")
        _write_device(paths, spec, index=index, links=links[index], rng=rng)
    if spec.ultraserver_nodes > 1:
        _write_ultraserver(paths, spec, ultraserver or SimUltraServer())
    listing = _neuron_ls(spec, lnc=lnc, logical=logical)
    _write(paths.neuron_ls_json, msgspec.json.format(msgspec.json.encode(listing)).decode() + "\n")
    _write(paths.neuron_ls, _NEURON_LS_SCRIPT)
    paths.neuron_ls.chmod(
        paths.neuron_ls.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH
    )

    if not paths.kernel_log.exists():
        _write(paths.kernel_log, "")
    for index in missing_devices:
        shutil.rmtree(paths.device(index), ignore_errors=True)
    for relative in unreadable:
        target = root / relative
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)
        target.mkdir(parents=True)
    for relative, content in (garbage or {}).items():
        _write(root / relative, content)
    return SimNode(
        root=root,
        instance_type=instance_type,
        node_name=node_name,
        neuron_ls_command=(str(paths.neuron_ls), "-j"),
        neuron_ls_json=paths.neuron_ls_json,
    )


def write_counter(root: Path, *, device: int, counter: str, total: int, present: int) -> None:
    """Set one of a simulated device's ECC counters (``sram_ecc_uncorrected`` etc.)."""
    directory = NodePaths(root).device(device) / "stats" / "hardware" / counter
    _write(directory / "total", f"{total}\n")
    _write(directory / "present", f"{present}\n")


def _write(path: Path, content: str) -> None:
    """Make ``path`` hold ``content``; a file that holds it already is left alone.

    The local stack writes every node's hardware again at each start (a fault injected
    since is repaired so): comparing costs a read, where truncating and writing each of a
    fleet's tens of thousands of files again took seconds of the start.
    """
    data = content.encode()
    try:
        if path.read_bytes() == data:
            return
    except OSError:
        pass  # not there yet (or not a file): written below, or refused as before
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _hex_id(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _write_device(
    paths: NodePaths,
    spec: InstanceSpec,
    *,
    index: int,
    links: tuple[int, ...],
    rng: random.Random,
) -> None:
    base = paths.device(index)
    # The driver writes core_count without a newline and an empty line when nothing is linked.
    _write(base / "core_count", str(spec.physical_cores_per_device))
    _write(base / "connected_devices", ", ".join(str(d) for d in links) + "\n")
    _write(base / "info" / "serial_number", f"{rng.getrandbits(64):016x}\n")
    arch = base / "info" / "architecture"
    _write(arch / "arch_type", f"{spec.arch_type}\n")
    _write(arch / "instance_type", f"{spec.arch_instance_type}\n")
    _write(arch / "device_name", f"{spec.device_name}\n")
    for name in ECC_COUNTERS.values():
        _write(base / "stats" / "hardware" / name / "total", "0\n")
        _write(base / "stats" / "hardware" / name / "present", "0\n")
    for core in range(spec.physical_cores_per_device):
        status = base / f"neuron_core{core}" / "stats" / "status"
        for name in CORE_STATUS_COUNTERS:
            total = rng.randrange(0, 100_000) if name == "success" else 0
            _write(status / name / "total", f"{total}\n")
            _write(status / name / "present", "0\n")


def _write_ultraserver(paths: NodePaths, spec: InstanceSpec, us: SimUltraServer) -> None:
    modes = ",".join(str(m) for m in us.supported_modes)
    _write(paths.class_file("ultraserver_mode"), f"{modes}\n")
    if spec.family == "trn3":
        node = "busy" if us.election_busy else str(us.node_id)
        _write(paths.class_file("node_id"), f"{node}\n")
        if us.reservation_id is not None:
            _write(paths.class_file("reservation_id"), f"{us.reservation_id}\n")
        return
    for size, server, node_id in (
        (2, us.server_id_2, us.node_id_2),
        (4, us.server_id_4, us.node_id_4),
    ):
        server_text = _ZERO_ID if us.election_busy else server
        node_text = "busy" if us.election_busy else str(node_id)
        _write(paths.class_file(f"server_id_{size}"), f"{server_text}\n")
        _write(paths.class_file(f"node_id_{size}"), f"{node_text}\n")


def _neuron_ls(spec: InstanceSpec, *, lnc: int | None, logical: int) -> list[dict[str, object]]:
    vcpus = _VCPUS.get(spec.name.split(".")[-1], 4)
    numa_nodes = 2 if spec.devices > 1 else 1
    per_numa = max(1, spec.devices // numa_nodes)
    links = adjacency(spec)
    listing: list[dict[str, object]] = []
    for index in range(spec.devices):
        numa = min(index // per_numa, numa_nodes - 1)
        entry: dict[str, object] = {
            "neuron_device": index,
            "bdf": f"0000:{0x20 + 4 * index:02x}:00.0",
            "cpu_affinity": _cpu_affinity(vcpus, numa=numa, numa_nodes=numa_nodes),
            "numa_node": str(numa),
            "connected_to": list(links[index]),
            "nc_count": logical,
            "memory_size": spec.memory_bytes_per_device,
            "neuroncore_ids": list(range(index * logical, (index + 1) * logical)),
            "neuron_processes": [],
        }
        if spec.default_lnc is not None:
            entry["logical_neuroncore_config"] = lnc or spec.default_lnc
        listing.append(entry)
    return listing


def _cpu_affinity(vcpus: int, *, numa: int, numa_nodes: int) -> str:
    # Two hardware threads per core: the first half of the vCPUs, then their siblings.
    cores = vcpus // 2
    per = cores // numa_nodes
    first = numa * per
    return f"{first}-{first + per - 1},{cores + first}-{cores + first + per - 1}"


#: What :func:`inject_fault` can do, by the name the CLI uses.
FAULTS = ("sram", "nc", "hbm", "dma", "hbm-repairable", "link-down", "repair")

# fault -> (kernel log error type or None, device counter or None, core counter or None)
_FAULT_SIGNALS: dict[str, tuple[str | None, str | None, str | None]] = {
    "sram": ("SRAM_UNCORRECTABLE_ERROR", "sram_ecc_uncorrected", None),
    "nc": ("NC_UNCORRECTABLE_ERROR", None, "hw_error"),
    "hbm": ("HBM_UNCORRECTABLE_ERROR", "mem_ecc_uncorrected", None),
    "dma": ("DMA_ERROR", None, None),
    "hbm-repairable": (None, "mem_ecc_repairable_uncorrected", None),
}


class FaultError(ValueError):
    """A fault that cannot be injected (unknown kind, device or core); says which."""


def _bump(directory: Path) -> tuple[int, int]:
    total = int((directory / "total").read_text().strip() or 0) + 1
    present = int((directory / "present").read_text().strip() or 0) + 1
    _write(directory / "total", f"{total}\n")
    _write(directory / "present", f"{present}\n")
    return total - 1, total


def _kernel_line(paths: NodePaths, node_name: str, message: str) -> str:
    # The layout of a syslog kernel line: time, host, "kernel:", the kernel's own timestamp.
    stamp = time.strftime("%b %d %H:%M:%S")
    uptime = time.monotonic()
    line = f"{stamp} {node_name} kernel: [{uptime:12.6f}] {message}\n"
    paths.kernel_log.parent.mkdir(parents=True, exist_ok=True)
    with open(paths.kernel_log, "a", encoding="utf-8") as fh:
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())
    return line.strip()


def _links(paths: NodePaths, index: int) -> list[int]:
    raw = (paths.device(index) / "connected_devices").read_text().strip()
    return [int(x) for x in raw.split(",") if x.strip()]


def _set_links(paths: NodePaths, index: int, links: Iterable[int]) -> None:
    _write(paths.device(index) / "connected_devices", ", ".join(map(str, links)) + "\n")


def _reload_device(paths: NodePaths, spec: InstanceSpec, index: int, *, node_name: str) -> None:
    """What a driver reload shows of one device: a new sysfs directory, counters at zero."""
    base = paths.device(index)
    serial = (base / "info" / "serial_number").read_text()
    fresh = base.with_name(f".{base.name}.new")
    old = base.with_name(f".{base.name}.old")
    shutil.rmtree(fresh, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)
    # Written beside the live directory, then swapped in with two renames, so a reader sees
    # the old device or the new one, never half of one.
    staging = _Staged(paths.root, fresh)
    _write_device(
        staging, spec, index=index, links=adjacency(spec)[index], rng=random.Random(node_name)
    )
    _write(fresh / "info" / "serial_number", serial)
    os.rename(base, old)
    os.rename(fresh, base)
    shutil.rmtree(old, ignore_errors=True)


class _Staged(NodePaths):
    """Paths whose one device directory is ``directory`` (for writing it aside)."""

    def __init__(self, root: Path, directory: Path) -> None:
        super().__init__(root)
        self._directory = directory

    def device(self, index: int) -> Path:
        return self._directory


def inject_fault(
    root: Path,
    *,
    fault: str,
    node_name: str,
    device: int | None = None,
    core: int = 0,
) -> list[str]:
    """Make the simulated node under ``root`` show ``fault``; returns what changed, in words.

    ``device`` defaults to 0 for a fault and to every device for ``repair``.

    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> _ = write_node(root, instance_type="trn2.48xlarge", node_name="n1")
    >>> inject_fault(root, fault="sram", node_name="n1", device=3)[1]
    'neuron3 sram_ecc_uncorrected total 0 -> 1'
    """
    if fault not in FAULTS:
        raise FaultError(f"fault {fault!r} is not one of {', '.join(FAULTS)}")
    paths = NodePaths(root)
    spec = instance_spec(paths.product_name.read_text().strip())
    if device is not None and not 0 <= device < spec.devices:
        raise FaultError(
            f"node {node_name}: device {device} does not exist ({spec.name} has "
            f"{spec.devices} devices, 0-{spec.devices - 1})"
        )
    if not 0 <= core < spec.physical_cores_per_device:
        raise FaultError(
            f"node {node_name}: core {core} does not exist ({spec.name} devices have "
            f"{spec.physical_cores_per_device} cores)"
        )
    done: list[str] = []
    if fault == "repair":
        targets = [device] if device is not None else list(range(spec.devices))
        for index in targets:
            _reload_device(paths, spec, index, node_name=node_name)
            done.append(f"neuron{index}: driver reloaded (counters at zero)")
        expected = adjacency(spec)
        for index in range(spec.devices):
            if sorted(_links(paths, index)) != sorted(expected[index]):
                _set_links(paths, index, expected[index])
                done.append(f"neuron{index}: links restored")
        return done
    index = 0 if device is None else device
    if fault == "link-down":
        links = _links(paths, index)
        if not links:
            raise FaultError(f"node {node_name}: neuron{index} has no link up to take down")
        peer = links[0]
        _set_links(paths, index, [d for d in links if d != peer])
        _set_links(paths, peer, [d for d in _links(paths, peer) if d != index])
        return [f"NeuronLink neuron{index} <-> neuron{peer} down"]
    error_type, counter, core_counter = _FAULT_SIGNALS[fault]
    if error_type is not None:
        serial = (paths.device(index) / "info" / "serial_number").read_text().strip()
        message = format_hw_error(
            error_type=error_type,
            device=index,
            core=core if error_type != "HBM_UNCORRECTABLE_ERROR" else None,
            instance_id="i-" + _hex_id(f"instance/{node_name}")[:17],
            hostname=node_name,
            serial_number=serial,
        )
        done.append(_kernel_line(paths, node_name, message))
    if counter is not None:
        before, after = _bump(paths.device(index) / "stats" / "hardware" / counter)
        done.append(f"neuron{index} {counter} total {before} -> {after}")
    if core_counter is not None:
        status = paths.core(index, core) / "stats" / "status" / core_counter
        before, after = _bump(status)
        done.append(f"neuron{index}/neuron_core{core} {core_counter} total {before} -> {after}")
    return done
