"""Start-up pieces that talk to the outside: feature detection and catching up from the bus."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Final

from neuron_dra_common.bus import Bus, replay
from neuron_dra_common.bus.declarations import HEALTH, INVENTORY, TAINTS
from neuron_dra_common.driver import DRIVER_NAME as DRIVER
from neuron_dra_common.events import AnyEvent, NodeInventory
from neuron_dra_common.kube import (
    RESOURCE_SLICES,
    UNANSWERED,
    ApiException,
    KubeClient,
    retriable,
)

from neuron_dra_slice_publisher.slices import NodeDeviceMode

__all__ = [
    "ANNOUNCED_READER",
    "HEALTH_DURABLE",
    "INVENTORY_DURABLE",
    "FeatureUnknown",
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
#: First and longest pause between two probes while the apiserver does not answer.
_FIRST_PAUSE = 0.5
_LONGEST_PAUSE = 10.0

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


class FeatureUnknown(RuntimeError):
    """The apiserver never answered whether it keeps a feature: the publisher does not start.

    Guessing is what must not happen: a replica that guessed ``node-only`` while the others
    run ``counters`` rewrites the UltraServer pools without their chips, and the scheduler
    then hands a node out while one of its chips is in use.
    """


async def _probe(
    client: KubeClient, body: dict[str, Any], *, what: str, setting: str, patience: float
) -> dict[str, Any]:
    """The apiserver's answer to a dry-run create of ``body``, asked again with a growing
    pause while it is unreachable or answers "later" (429, 5xx), for at most ``patience``
    seconds. Raises :class:`FeatureUnknown` naming ``what`` and the setting that skips the
    probe, when no definitive answer came.
    """
    name = body["metadata"]["name"]
    deadline = time.monotonic() + patience
    pause = _FIRST_PAUSE
    tries = 0
    while True:
        tries += 1
        try:
            return await client.create(RESOURCE_SLICES, body, dry_run=True)
        except ApiException as exc:
            if not retriable(exc):
                raise FeatureUnknown(
                    f"slice publisher: cannot tell whether the cluster keeps {what}: the "
                    f"dry-run create of ResourceSlice {name} was refused {exc}; grant the "
                    f"create, or set {setting} to say it"
                ) from exc
            why = str(exc)
        except UNANSWERED as exc:
            why = repr(exc)
        left = deadline - time.monotonic()
        if left <= 0:
            raise FeatureUnknown(
                f"slice publisher: cannot tell whether the cluster keeps {what}: no answer "
                f"from the apiserver {client.server} after {tries} tries in {patience:.0f} s "
                f"(last: {why}); not starting rather than guessing (set {setting} to say it)"
            )
        log.warning(
            "feature probe unanswered, trying again",
            extra={"probe": name, "error": why, "retry_in": round(min(pause, left), 1)},
        )
        await asyncio.sleep(min(pause, left))
        pause = min(pause * 2, _LONGEST_PAUSE)


async def detect_mode(
    client: KubeClient, setting: str, *, patience: float = 120.0
) -> NodeDeviceMode:
    """``counters`` where the apiserver keeps shared counters, else ``node-only``.

    A dry-run create says it exactly: a server without partitionable devices drops the
    field it does not serve, whatever its version number says. Only that answer decides:
    an error is never read as "not kept" (see :class:`FeatureUnknown`).
    """
    if setting != "auto":
        return NodeDeviceMode(setting)
    stored = await _probe(
        client, _PROBE, what="shared counters", setting="NEURON_DRA_NODE_DEVICE", patience=patience
    )
    kept = bool((stored.get("spec") or {}).get("sharedCounters"))
    mode = NodeDeviceMode.COUNTERS if kept else NodeDeviceMode.NODE_ONLY
    log.info("node device mode", extra={"mode": mode.value, "shared_counters": kept})
    return mode


async def read_inventories(
    bus: Bus, *, name: str = INVENTORY_DURABLE, subjects: tuple[str, ...] = INVENTORY.subjects
) -> list[NodeInventory]:
    """Every inventory the stream holds on ``subjects`` (the latest per node), to catch up
    after a restart.

    One that is refused goes to the dead letter of the durable consumer ``name`` (the
    consumer refuses it too, and the dead letter is stored once).
    """
    stored: list[AnyEvent] = []
    for subject in subjects:
        stored += await replay(bus, name=name, stream=INVENTORY.name, subject=subject)
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


async def detect_taints(client: KubeClient, setting: str, *, patience: float = 120.0) -> bool:
    """Whether the apiserver keeps device taints (DRADeviceTaints on: 1.36, not 1.34).

    Like :func:`detect_mode`, a dry-run create tells (a server without the feature drops
    the field without an error), and only its answer decides.
    """
    if setting != "auto":
        return setting == "on"
    stored = await _probe(
        client,
        _TAINT_PROBE,
        what="device taints",
        setting="NEURON_DRA_DEVICE_TAINTS",
        patience=patience,
    )
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
