"""What a container gets for the devices or cores allocated to it (``Allocate``). Pure.

- ``/dev/neuronN`` for every device it touches (read and write; the host path may live under
  another root, as on a simulated node);
- ``NEURON_RT_VISIBLE_CORES``: exactly its host-global core ids, as ranges (``4-7,12-15``):
  all cores of its devices, or the cores it was given;
- ``NEURON_LOGICAL_NC_CONFIG`` where the instance has a logical core setting.

A request for whole devices in a count the instance cannot serve as a connected set is
refused with the scheduler extension's text (``Instance type trn1.32xlarge does not support
requests for device: 7. ...``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import msgspec
from neuron_dra_common.extended import CORE_RESOURCE
from neuron_dra_common.topology import check_request, format_ranges

from neuron_dra_device_plugin.inventory import Inventory

__all__ = ["ContainerEdits", "DeviceNode", "container_edits"]

PERMISSIONS = "rw"


class DeviceNode(msgspec.Struct, frozen=True, kw_only=True):
    container_path: str
    host_path: str
    permissions: str = PERMISSIONS


class ContainerEdits(msgspec.Struct, frozen=True, kw_only=True):
    """Device nodes and environment for one container."""

    devices: tuple[DeviceNode, ...]
    env: dict[str, str]
    units: tuple[int, ...]


def container_edits(
    inventory: Inventory, *, resource: str, units: Iterable[int], dev_root: str
) -> ContainerEdits:
    """The edits for ``units`` (device indices, or core ids for ``aws.amazon.com/neuroncore``).

    >>> from neuron_dra_common.topology import instance_spec
    >>> inv = Inventory(instance_type="inf2.48xlarge", spec=instance_spec("inf2.48xlarge"),
    ...                 devices=tuple(range(12)), cores_per_device=2)
    >>> edits = container_edits(inv, resource="aws.amazon.com/neuron", units=[3, 4],
    ...                         dev_root="/dev")
    >>> edits.env, [d.host_path for d in edits.devices]
    ({'NEURON_RT_VISIBLE_CORES': '6-9'}, ['/dev/neuron3', '/dev/neuron4'])
    """
    chosen = tuple(sorted(set(units)))
    if resource == CORE_RESOURCE:
        devices = sorted({inventory.device_of(c) for c in chosen})
        cores = chosen
    else:
        check_request(inventory.instance_type, len(chosen))
        devices = list(chosen)
        cores = inventory.cores(chosen)
    env = {"NEURON_RT_VISIBLE_CORES": format_ranges(cores)}
    if inventory.lnc is not None:
        env["NEURON_LOGICAL_NC_CONFIG"] = str(inventory.lnc)
    nodes = tuple(
        DeviceNode(
            container_path=f"/dev/neuron{d}",
            host_path=os.path.join(dev_root, f"neuron{d}"),
        )
        for d in devices
    )
    return ContainerEdits(devices=nodes, env=env, units=chosen)
