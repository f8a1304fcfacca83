"""A node agent's sign of life: ``NodeHeartbeat`` every second or so while the node is alive.

The cluster failure detector (the health monitor) declares a node lost when its heartbeats
stop. Discovery sends them on the nodes the DRA driver serves, the device plugin on the nodes
kept on the device plugin: one agent per node, whichever manages its devices.
"""

from __future__ import annotations

import asyncio
import logging
import math
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, Literal

from neuron_dra_common.bus import AlivePublisher, Publisher, PublishError
from neuron_dra_common.events import NodeHeartbeat

__all__ = [
    "ALIVE_MISSES",
    "HELLO_SECONDS",
    "Heartbeat",
    "alive_ttl",
    "kubelet_probe",
    "read_boot_id",
]

log = logging.getLogger(__name__)

#: An alive beat lives this many intervals on the bus: the failure detector's default window.
ALIVE_MISSES: Final = 3
#: A ttl-mode agent says hello again this often, so ``NEURON_HEARTBEAT`` (one day's max age)
#: always holds its node: a detector that starts reads the fleet from there.
HELLO_SECONDS: Final = 3600.0


def alive_ttl(interval: float) -> int:
    """Whole seconds an alive beat lives: ``ALIVE_MISSES`` intervals, at least 2 s (NATS counts
    a message TTL in whole seconds, and one under two intervals expires between beats).

    >>> alive_ttl(1.0), alive_ttl(0.5), alive_ttl(2.5)
    (3, 2, 8)
    """
    return max(2, math.ceil(ALIVE_MISSES * interval))


def read_boot_id(path: str) -> str:
    """The node's boot id; empty when the file cannot be read (then only generations order)."""
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        log.warning("boot id unreadable", extra={"path": path, "error": str(exc)})
        return ""


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
        mode: Literal["stream", "ttl"] = "stream",
        alive: AlivePublisher | None = None,
    ) -> None:
        if mode == "ttl" and alive is None:
            raise ValueError("heartbeat_mode ttl: alive beats need an AlivePublisher")
        self._publisher = publisher
        self._mode = mode
        self._alive_publisher = alive
        self._ttl = alive_ttl(interval) if mode == "ttl" else 0
        self._hello_at: float | None = None
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
        if self._mode == "stream":
            return await self._send(stopping=False)
        now = asyncio.get_running_loop().time()
        if self._hello_at is None or now - self._hello_at >= HELLO_SECONDS:
            # Until the hello is stored, the detector judges this node by NodeHeartbeats.
            if not await self._send(stopping=False):
                return False
            self._hello_at = now
        return await self._alive()

    async def _alive(self) -> bool:
        """One alive beat: kept by the bus for the node's window, then dropped."""
        assert self._alive_publisher is not None
        self._sequence += 1
        try:
            await self._alive_publisher.publish(
                ttl=self._ttl,
                sequence=self._sequence,
                instance=self._instance,
                boot_id=self._boot_id,
            )
        except PublishError as exc:
            log.warning("alive beat not sent", extra={"error": str(exc)})
            return False
        self.sent += 1
        return True

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
                    alive_ttl_seconds=float(self._ttl),
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
