"""Start-up pieces that talk to the outside: feature detection and catching up from the bus."""

from __future__ import annotations

import logging
from typing import Any

import nats.errors
from nats.js import JetStreamContext
from neuron_dra_common.bus.declarations import INVENTORY
from neuron_dra_common.driver import DRIVER_NAME as DRIVER
from neuron_dra_common.events import DecodeError, NodeInventory, decode
from neuron_dra_common.kube import RESOURCE_SLICES, ApiException, KubeClient

from neuron_dra_slice_publisher.slices import NodeDeviceMode

__all__ = ["detect_mode", "read_inventories"]

log = logging.getLogger(__name__)

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


async def read_inventories(js: JetStreamContext) -> list[NodeInventory]:
    """Every inventory the stream holds (the latest per node), to catch up after a restart."""
    info = await js.stream_info(INVENTORY.name)
    found: list[NodeInventory] = []
    if not info.state.messages:
        return found
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        try:
            raw = await js.get_msg(INVENTORY.name, seq)
        except nats.js.errors.NotFoundError:
            continue  # replaced by a newer inventory of the same node
        except nats.errors.Error as exc:
            log.warning("inventory catch-up read failed", extra={"seq": seq, "error": repr(exc)})
            continue
        try:
            event = decode(raw.data or b"")
        except DecodeError:
            continue  # the durable consumer dead-letters it with its reason
        if isinstance(event, NodeInventory):
            found.append(event)
    return found
