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
"""

from __future__ import annotations

import hashlib
import random
import shutil
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path

import msgspec

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
    "SimNode",
    "SimUltraServer",
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
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content, encoding="utf-8")


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
        write_counter(paths.root, device=index, counter=name, total=0, present=0)
    for core in range(spec.physical_cores_per_device):
        status = paths.core(index, core) / "stats" / "status"
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
