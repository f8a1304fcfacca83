"""One node's hardware: sysfs and ``neuron-ls`` merged into a :class:`NodeHardware`.

sysfs is the authority for which devices exist and how they are linked; ``neuron-ls`` adds what
only it reports (PCI address, NUMA node, CPU affinity, logical core count, memory). Whatever
disagrees or is missing becomes a problem in the result; nothing here raises on odd hardware.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from neuron_dra_common.hardware.files import ProblemLog
from neuron_dra_common.hardware.layout import NodePaths
from neuron_dra_common.hardware.model import NeuronDevice, NodeHardware
from neuron_dra_common.hardware.neuronls import NeuronLsDevice, NeuronLsResult, read_neuron_ls
from neuron_dra_common.hardware.sysfs import read_sysfs
from neuron_dra_common.topology.catalog import UnknownInstanceType, instance_spec

__all__ = ["merge", "read_node"]


def read_node(
    root: Path = Path("/"),
    *,
    neuron_ls_command: Sequence[str] | None = None,
    neuron_ls_path: Path | None = None,
    instance_type: str | None = None,
    timeout: float = 30.0,
) -> NodeHardware:
    """Read the node under ``root``.

    ``neuron-ls`` output comes from ``neuron_ls_path`` when given, else from running
    ``neuron_ls_command`` (default ``neuron-ls -j``). ``instance_type`` overrides the DMI
    product name (for nodes where IMDS or a node label is the better source). For a simulated
    node: ``read_node(sim.root, neuron_ls_command=sim.neuron_ls_command)``.
    """
    neuron_ls = read_neuron_ls(command=neuron_ls_command, path=neuron_ls_path, timeout=timeout)
    return merge(root, neuron_ls=neuron_ls, instance_type=instance_type)


def merge(
    root: Path, *, neuron_ls: NeuronLsResult, instance_type: str | None = None
) -> NodeHardware:
    """Read sysfs under ``root`` and merge in already-read ``neuron-ls`` output."""
    sysfs = read_sysfs(root)
    paths = NodePaths(root)
    problems = ProblemLog()
    problems.extend(sysfs.problems)
    problems.extend(neuron_ls.problems)

    by_index = {d.neuron_device: d for d in neuron_ls.devices}
    devices = tuple(_merge_device(d, by_index.get(d.index), problems) for d in sysfs.devices)
    seen = {d.index for d in sysfs.devices}
    for extra in sorted(set(by_index) - seen):
        problems.add(
            paths.device(extra), "listed by neuron-ls but not usable in sysfs", device=extra
        )

    name = instance_type or sysfs.product_name or ""
    if not name:
        problems.add(paths.product_name, "instance type unknown", fatal=True)
    else:
        _check_catalog(name, devices=devices, paths=paths, problems=problems)

    lnc = sysfs.lnc
    if lnc is None:
        # Without the node's LNC file, neuron-ls still says which config the devices run.
        configs = {d.logical_neuroncore_config for d in neuron_ls.devices}
        if len(configs) == 1:
            lnc = configs.pop()
    return NodeHardware(
        instance_type=name,
        driver_version=sysfs.driver_version,
        default_lnc=lnc,
        devices=devices,
        ultraserver=sysfs.ultraserver,
        problems=problems.items,
    )


def _merge_device(
    device: NeuronDevice, listed: NeuronLsDevice | None, problems: ProblemLog
) -> NeuronDevice:
    if listed is None:
        problems.add(f"neuron-ls device {device.index}", "not listed", device=device.index)
        return device
    connected = device.connected_devices
    if not connected and listed.connected_to:
        connected = listed.connected_to
    elif listed.connected_to and set(listed.connected_to) != set(connected):
        problems.add(
            f"neuron-ls device {device.index}",
            f"connected_to {list(listed.connected_to)} disagrees with sysfs {list(connected)}",
            device=device.index,
        )
    return NeuronDevice(
        index=device.index,
        physical_cores=device.physical_cores,
        logical_cores=listed.nc_count,
        memory_bytes=listed.memory_size,
        connected_devices=connected,
        serial_number=device.serial_number,
        arch=device.arch,
        bdf=listed.bdf,
        numa_node=listed.numa_node,
        cpu_affinity=listed.cpu_affinity,
        ecc=device.ecc,
        cores=device.cores,
    )


def _check_catalog(
    name: str, *, devices: tuple[NeuronDevice, ...], paths: NodePaths, problems: ProblemLog
) -> None:
    try:
        spec = instance_spec(name)
    except UnknownInstanceType as exc:
        problems.add(paths.product_name, str(exc))
        return
    if len(devices) != spec.devices:
        problems.add(
            paths.dev,
            f"instance type {spec.name} has {spec.devices} devices, {len(devices)} usable",
        )
