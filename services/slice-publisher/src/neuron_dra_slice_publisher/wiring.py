"""Start-up pieces that talk to the outside: feature detection and catching up from the bus."""

from __future__ import annotations

import logging
from typing import Any, Final

from neuron_dra_common.bus import Bus, replay
from neuron_dra_common.bus.declarations import HEALTH, INVENTORY, TAINTS
from neuron_dra_common.driver import DRIVER_NAME as DRIVER
from neuron_dra_common.events import AnyEvent, NodeInventory
from neuron_dra_common.kube import RESOURCE_SLICES, ApiException, KubeClient

from neuron_dra_slice_publisher.slices import NodeDeviceMode

__all__ = [
    "ANNOUNCED_READER",
    "HEALTH_DURABLE",
    "INVENTORY_DURABLE",
    "detect_mode",
    "detect_taints",
    "read_announced",
    "read_health",
    "read_inventories",
]

log = logging.getLogger(__name__)

INVENTORY_DURABLE: Final = "slice-publisher-inventory"
HEALTH_DURABLE: Final = "slice-publisher-health"
#: What this publisher reads back of its own taint reports (dead letters go under this name).
ANNOUNCED_READER: Final = "slice-publisher-taints"

_PROBE: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceSlice",
    "metadata": {"name": "neuron-dra-shared-counter-probe"},
    "spec": {
        "driver": DRIVER,
        "nodeName": "neuron-dra-probe",
        "pool": {"name": "neuron-dra-probe", "generation": 1, "resourceSliceCount": 1},
        "sharedCounters": [{"name": "probe", "counters": {"probe": {"value": "1"}}}],
    },
}


async def detect_mode(client: KubeClient, setting: str) -> NodeDeviceMode:
    """``counters`` where the apiserver keeps shared counters, else ``node-only``.

    A dry-run create says it exactly: a server without partitionable devices drops the
    field it does not serve, whatever its version number says.
    """
    if setting != "auto":
        return NodeDeviceMode(setting)
    try:
        stored = await client.request(
            "POST", RESOURCE_SLICES.path(), query=[("dryRun", "All")], body=_PROBE
        )
    except ApiException as exc:
        log.warning("shared counter probe refused", extra={"status": exc.status})
        return NodeDeviceMode.NODE_ONLY
    kept = bool((stored.get("spec") or {}).get("sharedCounters"))
    mode = NodeDeviceMode.COUNTERS if kept else NodeDeviceMode.NODE_ONLY
    log.info("node device mode", extra={"mode": mode.value, "shared_counters": kept})
    return mode


async def read_inventories(bus: Bus) -> list[NodeInventory]:
    """Every inventory the stream holds (the latest per node), to catch up after a restart.

    One that is refused goes to the dead letter of the durable consumer, under its name (the
    consumer refuses it too, and the dead letter is stored once).
    """
    stored = await replay(
        bus, name=INVENTORY_DURABLE, stream=INVENTORY.name, subject=INVENTORY.subjects[0]
    )
    return [event for event in stored if isinstance(event, NodeInventory)]


_TAINT_PROBE: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceSlice",
    "metadata": {"name": "neuron-dra-device-taint-probe"},
    "spec": {
        "driver": DRIVER,
        "nodeName": "neuron-dra-probe",
        "pool": {"name": "neuron-dra-probe", "generation": 1, "resourceSliceCount": 1},
        "devices": [
            {
                "name": "probe",
                "taints": [{"key": "neuron.aws.com/probe", "value": "x", "effect": "NoSchedule"}],
            }
        ],
    },
}


async def detect_taints(client: KubeClient, setting: str) -> bool:
    """Whether the apiserver keeps device taints (DRADeviceTaints on: 1.36, not 1.34).

    Like :func:`detect_mode`, a dry-run create tells: a server without the feature drops
    the field without an error.
    """
    if setting != "auto":
        return setting == "on"
    try:
        stored = await client.request(
            "POST", RESOURCE_SLICES.path(), query=[("dryRun", "All")], body=_TAINT_PROBE
        )
    except ApiException as exc:
        log.warning("device taint probe refused", extra={"status": exc.status})
        return False
    devices = (stored.get("spec") or {}).get("devices") or [{}]
    kept = bool(devices[0].get("taints"))
    log.info("device taints", extra={"served": kept})
    return kept


async def read_health(bus: Bus) -> list[AnyEvent]:
    """The latest health event of every device and node, to catch up after a restart."""
    return await replay(
        bus,
        name=HEALTH_DURABLE,
        stream=HEALTH.name,
        subject=HEALTH.subjects[0],
        last_per_subject=True,
    )


async def read_announced(bus: Bus) -> list[AnyEvent]:
    """The latest taint change reported for every device, so a restart repeats none."""
    return await replay(
        bus,
        name=ANNOUNCED_READER,
        stream=TAINTS.name,
        subject=TAINTS.subjects[0],
        last_per_subject=True,
    )
