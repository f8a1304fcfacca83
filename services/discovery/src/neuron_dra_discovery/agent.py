"""The discovery loop: read the hardware, publish what the tracker asks for (the node's
heartbeats are :mod:`neuron_dra_common.liveness`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from neuron_dra_common.bus import Publisher, PublishError
from neuron_dra_common.hardware.model import NodeHardware
from neuron_dra_common.hardware.node import read_node
from neuron_dra_common.liveness import read_boot_id

from neuron_dra_discovery.inventory import Tracker
from neuron_dra_discovery.settings import DiscoverySettings

__all__ = ["Agent", "hardware_reader", "make_tracker"]

log = logging.getLogger(__name__)

Reader = Callable[[], NodeHardware]


def hardware_reader(settings: DiscoverySettings) -> Reader:
    """A blocking function that reads this node's hardware as the settings say."""
    root = Path(settings.host_root)
    command = settings.neuron_ls_command or None
    path = Path(settings.neuron_ls_path) if settings.neuron_ls_path else None
    instance_type = settings.instance_type or None

    def read() -> NodeHardware:
        return read_node(
            root, neuron_ls_command=command, neuron_ls_path=path, instance_type=instance_type
        )

    return read


class Agent:
    """Publishes this node's NodeInventory on start, on change and as a heartbeat."""

    def __init__(
        self,
        *,
        publisher: Publisher,
        tracker: Tracker,
        read: Reader,
        poll_seconds: float,
    ) -> None:
        self._publisher = publisher
        self._tracker = tracker
        self._read = read
        self._poll = poll_seconds
        self._stop = asyncio.Event()
        self.published = 0
        self.ready = False

    def stop(self) -> None:
        self._stop.set()

    async def tick(self) -> None:
        """One read and whatever publish it calls for."""
        try:
            # Reading runs neuron-ls and walks sysfs: keep it off the event loop.
            hardware = await asyncio.to_thread(self._read)
        except Exception as exc:  # odd hardware must never stop the agent
            log.error("hardware read failed", extra={"error": repr(exc)})
            return
        now = datetime.now(UTC)
        decision = self._tracker.observe(hardware, now=now)
        if decision is None:
            return
        try:
            await self._publisher.publish(decision.event, msg_id=decision.msg_id)
        except PublishError as exc:
            self._tracker.forget_sent()
            log.error("inventory publish failed", extra={"error": str(exc)})
            return
        self.published += 1
        self.ready = True
        log.info(
            "inventory published",
            extra={
                "node": self._tracker.node,
                "reason": decision.reason,
                "generation": decision.event.generation,
                "devices": len(hardware.devices),
                "problems": len(hardware.problems),
            },
        )

    async def run(self) -> None:
        while not self._stop.is_set():
            await self.tick()
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=self._poll)
            except TimeoutError:
                continue


def make_tracker(settings: DiscoverySettings, *, dra_driver_version: str) -> Tracker:
    return Tracker(
        node=settings.node_name,
        boot_id=read_boot_id(settings.boot_id_path),
        heartbeat_seconds=settings.heartbeat_seconds,
        dra_driver_version=dra_driver_version,
    )
