"""Inventories of whole catalog nodes, as the device plugin builds them from the hardware."""

from __future__ import annotations

from neuron_dra_common.topology import instance_spec, logical_cores_per_device
from neuron_dra_device_plugin.inventory import Inventory


def inventory(instance_type: str, *, lnc: int | None = None) -> Inventory:
    spec = instance_spec(instance_type)
    effective = lnc if lnc is not None else spec.default_lnc
    return Inventory(
        instance_type=instance_type,
        spec=spec,
        devices=tuple(range(spec.devices)),
        cores_per_device=logical_cores_per_device(spec, effective),
        lnc=effective,
    )
