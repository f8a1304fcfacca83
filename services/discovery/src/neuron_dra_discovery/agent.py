"""The discovery loop: read the hardware, publish what the tracker asks for, send heartbeats."""

from __future__ import annotations

import asyncio
import logging
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

from neuron_dra_common.bus import Publisher, PublishError
from neuron_dra_common.events import NodeHeartbeat
from neuron_dra_common.hardware.model import NodeHardware
from neuron_dra_common.hardware.node import read_node

from neuron_dra_discovery.inventory import Tracker
from neuron_dra_discovery.settings import DiscoverySettings

__all__ = ["Agent", "Heartbeat", "hardware_reader", "kubelet_probe", "read_boot_id"]

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


def read_boot_id(path: str) -> str:
    """The node's boot id; empty when the file cannot be read (then only generations order)."""
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        log.warning("boot id unreadable", extra={"path": path, "error": str(exc)})
        return ""


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


class Heartbeat:
    """Sends ``NodeHeartbeat`` every ``interval`` seconds while the node is alive.

    Alive means this process runs and, when ``probe`` is given, the node's kubelet answers
    its health check: a node whose kubelet died runs no pods, so its heartbeats stop and the
    failure detector declares it lost (as it would a node that lost power).

    Stopped in an orderly way (:meth:`stop`, on SIGTERM), it sends one last heartbeat marked
    ``stopping``, so the detector takes the silence of a rolling update or a restart for what
    it is; a process killed outright sends nothing and its node is judged by the usual rule.
    """

    def __init__(
        self,
        *,
        publisher: Publisher,
        node: str,
        boot_id: str,
        interval: float,
        probe: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self._publisher = publisher
        self._node = node
        self._boot_id = boot_id
        self._interval = interval
        self._probe = probe
        self._stop = asyncio.Event()
        self._sequence = 0
        # A restarted process numbers from 1 again: its ids must not be taken for duplicates.
        self._instance = uuid.uuid4().hex[:12]
        self._held = False
        self.sent = 0

    def stop(self) -> None:
        self._stop.set()

    async def beat(self) -> bool:
        """One heartbeat, unless the kubelet is down; True when one was sent."""
        if self._probe is not None and not await self._probe():
            if not self._held:
                log.warning("kubelet not healthy: heartbeats held", extra={"node": self._node})
            self._held = True
            return False
        if self._held:
            log.warning("kubelet healthy again: heartbeats resume", extra={"node": self._node})
            self._held = False
        return await self._send(stopping=False)

    async def goodbye(self) -> bool:
        """The last heartbeat, marked ``stopping``; True when it was sent.

        Not sent while heartbeats are held: a node whose kubelet is down is not alive, and a
        goodbye would buy it the detector's restart grace.
        """
        if self._held:
            return False
        sent = await self._send(stopping=True)
        if sent:
            log.info("stopping: goodbye heartbeat sent", extra={"node": self._node})
        return sent

    async def _send(self, *, stopping: bool) -> bool:
        now = datetime.now(UTC)
        self._sequence += 1
        try:
            await self._publisher.publish(
                NodeHeartbeat(
                    node=self._node,
                    boot_id=self._boot_id,
                    sequence=self._sequence,
                    sent_at=now,
                    interval_seconds=self._interval,
                    instance=self._instance,
                    stopping=stopping,
                ),
                msg_id=f"heartbeat/{self._node}/{self._instance}/{self._sequence}",
            )
        except PublishError as exc:
            log.warning("heartbeat not sent", extra={"error": str(exc), "stopping": stopping})
            return False
        self.sent += 1
        return True

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while not self._stop.is_set():
            await self.beat()
            # On a fixed rhythm: a slow publish does not stretch the interval.
            next_at = max(next_at + self._interval, loop.time())
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=next_at - loop.time())
            except TimeoutError:
                continue
        await self.goodbye()


def kubelet_probe(url: str, *, timeout: float = 0.5) -> Callable[[], Awaitable[bool]]:
    """Whether the kubelet at ``url`` answers its health check with 200 ``ok``."""

    def check() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=timeout) as answer:
                return bool(answer.status == 200)
        except (OSError, ValueError):
            return False

    async def probe() -> bool:
        return await asyncio.to_thread(check)

    return probe


def make_tracker(settings: DiscoverySettings, *, dra_driver_version: str) -> Tracker:
    return Tracker(
        node=settings.node_name,
        boot_id=read_boot_id(settings.boot_id_path),
        heartbeat_seconds=settings.heartbeat_seconds,
        dra_driver_version=dra_driver_version,
    )
