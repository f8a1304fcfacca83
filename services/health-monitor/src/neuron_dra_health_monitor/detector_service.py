"""The failure detector at work: heartbeats from the bus in, NodeLost / NodeRecovered out.

While it leads, :class:`FailureDetector` consumes ``health-monitor-heartbeats`` (the bus
runner: ack, dead letter for what does not decode), judges every ``tick`` with
:class:`~neuron_dra_health_monitor.detector.Detector`, and publishes its verdicts on the
``NEURON_HEALTH`` stream (``neuron.health.<node>.node``), so the allocator, the operator and
the audit stream see them. Before judging it reads back what it declared before (the last
event of each node's subject), the nodes the heartbeat stream knows, and the nodes held as
flapping, then waits one full window of fresh heartbeats. A reconnect to the bus starts that
wait again: what the detector could not hear is never a node's fault. A node whose agent said
goodbye (a heartbeat marked ``stopping``) is waited for up to the restart grace; that is
logged and shown as Events on the Node, not published.

Nodes whose agents beat in ``ttl`` mode send only a hello and a goodbye on that consumer;
their alive beats stay on ``NEURON_ALIVE`` for the node's window and the bus drops them
after. Once every ``poll`` seconds the detector asks the bus which of them it still holds
(one ``STREAM.INFO`` request with a subjects filter): no beat is delivered to it. What it
cannot trust is treated as a reconnect (judge nobody for the reconnect grace): a request that
fails, a new stream leader, or a stream whose first sequence went back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Final

from neuron_dra_common.bus import AliveView, Blind, Bus, Delivery, PublishError, replay
from neuron_dra_common.bus.declarations import HEALTH, HEARTBEAT
from neuron_dra_common.events import AnyEvent, NodeHeartbeat, NodeLost, NodeRecovered
from neuron_dra_common.events.base import SUBJECT_ROOT, Event, subject_token

from neuron_dra_health_monitor.detector import Detector, Verdict
from neuron_dra_health_monitor.detector_kube import NodeNotes

__all__ = ["DURABLE", "FailureDetector"]

log = logging.getLogger(__name__)

DURABLE: Final = "health-monitor-heartbeats"
#: The detector's own events: one subject per node, the latest is what it last said.
NODE_SUBJECTS: Final = f"{SUBJECT_ROOT}.health.*.node"
#: Lost ttl-mode nodes whose last alive beat is read back per poll, for their recovery.
RECOVERY_READS: Final = 100


class FailureDetector:
    """One leader's run of the detector (a new one per leadership)."""

    def __init__(
        self,
        *,
        bus: Bus,
        detector: Detector,
        notes: NodeNotes | None,
        source: str,
        clock: Callable[[], float] | None = None,
        poll: float = 1.0,
        poll_timeout: float = 2.0,
    ) -> None:
        self._bus = bus
        self.detector = detector
        self._notes = notes
        self._publisher = bus.publisher(source=source)
        self._clock = clock or asyncio.get_running_loop().time
        self._unsent: list[Verdict] = []
        self._blind = False
        self.published: list[Event] = []
        self._poll = poll
        self._polled_at = float("-inf")
        self.alive = AliveView(bus.nc, bus.js, timeout=poll_timeout)

    async def prepare(self) -> None:
        """Read back the detector's own last word on each node, the known nodes and the held
        ones; judge nobody for one window from now."""
        now = self._clock()
        wall = datetime.now(UTC)
        for event in await replay(
            self._bus,
            name=DURABLE,
            stream=HEALTH.name,
            subject=NODE_SUBJECTS,
            last_per_subject=True,
        ):
            if isinstance(event, NodeLost):
                lost_for = (wall - event.detected_at).total_seconds()
                self.detector.restore(event.node, lost=True, now=now, lost_for=max(lost_for, 0))
            elif isinstance(event, NodeRecovered):
                self.detector.restore(event.node, lost=False, now=now)
        for event in await replay(
            self._bus,
            name=DURABLE,
            stream=HEARTBEAT.name,
            subject=HEARTBEAT.subjects[0],
            last_per_subject=True,
        ):
            if isinstance(event, NodeHeartbeat):
                self.detector.known(
                    event.node,
                    now=now,
                    interval=event.interval_seconds,
                    stopping=event.stopping,
                    ttl=event.alive_ttl_seconds,
                )
        if self._notes is not None:
            for node in await self._notes.held_nodes():
                self.detector.hold(node, now=now)
        self.detector.resume(now=self._clock())
        log.info(
            "failure detector ready",
            extra={
                "known": len(self.detector.nodes),
                "lost": self.detector.lost(),
                "restarting": self.detector.restarting(),
            },
        )

    async def handle(self, event: AnyEvent, delivery: Delivery) -> None:
        """The bus handler of ``health-monitor-heartbeats``."""
        if isinstance(event, NodeHeartbeat):
            self.detector.heard(
                event.node,
                now=self._clock(),
                interval=event.interval_seconds,
                sequence=event.sequence,
                boot_id=event.boot_id,
                sent_at=event.sent_at,
                instance=event.instance,
                stopping=event.stopping,
                ttl=event.alive_ttl_seconds,
            )

    async def poll_once(self) -> bool:
        """Ask the bus which ttl-mode nodes are alive and tell the detector; read back the
        last beat of lost nodes still there (their recovery). False: blind."""
        by_token = {subject_token(n): n for n, s in self.detector.nodes.items() if s.ttl > 0}
        if not by_token:
            return True
        try:
            tokens = await self.alive.tokens()
        except Blind as exc:
            if not self._blind:
                log.warning("alive beats unknown: judging nobody", extra={"error": str(exc)})
            self._blind = True
            return False
        now = self._clock()
        present = {by_token[t] for t in tokens if t in by_token}
        self.detector.answer(present, now=now, wall=datetime.now(UTC))
        lost = [n for n in self.detector.lost() if n in present][:RECOVERY_READS]
        for node in lost:
            await self._read_back(node)
        return True

    async def _read_back(self, node: str) -> None:
        """Hand a lost node's last alive beat to the detector (a repeat is ignored there)."""
        beat = await self.alive.last(node)
        if beat is None:
            return
        self.detector.heard(
            node,
            now=self._clock(),
            interval=self.detector.nodes[node].interval,
            sequence=beat.sequence,
            boot_id=beat.boot_id,
            sent_at=beat.stored_at,
            instance=beat.instance,
        )

    async def judge_forever(self, *, tick: float, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.judge_once()
            try:
                await asyncio.wait_for(stop.wait(), timeout=tick)
            except TimeoutError:
                continue

    async def judge_once(self) -> None:
        now = self._clock()
        if not self._bus.connected:
            self._blind = True
            return
        if now - self._polled_at >= 0.9 * self._poll:
            self._polled_at = now
            if not await self.poll_once():
                return
        if self._blind:
            # Back on the bus: heartbeats sent meanwhile were not heard; wait for fresh ones.
            self._blind = False
            self.detector.resume(now=now, reconnected=True)
            log.info(
                "bus back: judging again after the reconnect grace",
                extra={"seconds": self.detector.rules.reconnect_grace},
            )
        verdicts = self._unsent + self.detector.judge(now=now)
        self._unsent = []
        for verdict in verdicts:
            try:
                await self._act(verdict)
            except PublishError as exc:
                # Decided but not stored: sent again next tick (its id makes it stored once).
                log.warning(
                    "verdict not published", extra={"node": verdict.node, "error": str(exc)}
                )
                self._unsent.append(verdict)

    async def _act(self, verdict: Verdict) -> None:
        wall = datetime.now(UTC)
        if verdict.kind == "lost":
            lost = NodeLost(
                node=verdict.node,
                last_heartbeat_at=verdict.last_heartbeat_at,
                detected_at=wall,
                reason=verdict.reason,
            )
            stamp = verdict.last_heartbeat_at.timestamp() if verdict.last_heartbeat_at else 0
            await self._publisher.publish(lost, msg_id=f"lost-{verdict.node}-{stamp:.3f}")
            self.published.append(lost)
            log.warning("node lost", extra={"node": verdict.node, "reason": verdict.reason})
            if self._notes is not None:
                await self._notes.event(
                    verdict.node, reason="NodeLost", message=verdict.reason, warning=True
                )
        elif verdict.kind == "recovered":
            recovered = NodeRecovered(
                node=verdict.node, detected_at=wall, lost_for_seconds=round(verdict.lost_for, 3)
            )
            await self._publisher.publish(
                recovered, msg_id=f"recovered-{verdict.node}-{wall.timestamp():.0f}"
            )
            self.published.append(recovered)
            log.warning("node recovered", extra={"node": verdict.node})
            if self._notes is not None:
                message = f"heartbeats again after {verdict.lost_for:.1f} s lost"
                await self._notes.event(
                    verdict.node, reason="NodeRecovered", message=message, warning=False
                )
        elif verdict.kind == "restarting":
            log.info(
                "node agent restarting", extra={"node": verdict.node, "reason": verdict.reason}
            )
            if self._notes is not None:
                await self._notes.event(
                    verdict.node,
                    reason="NodeAgentRestarting",
                    message=verdict.reason,
                    warning=False,
                )
        elif verdict.kind == "restarted":
            away = f"heartbeats again after its agent was away {verdict.lost_for:.1f} s"
            log.info("node agent back", extra={"node": verdict.node, "away": verdict.lost_for})
            if self._notes is not None:
                await self._notes.event(
                    verdict.node, reason="NodeAgentRestarted", message=away, warning=False
                )
        elif self._notes is not None:
            try:
                if verdict.kind == "hold":
                    await self._notes.hold(verdict.node, reason=verdict.reason)
                else:
                    await self._notes.release(verdict.node, reason=verdict.reason)
            except Exception as exc:  # the apiserver away: the node is held again at restart
                log.warning("taint not changed", extra={"node": verdict.node, "error": repr(exc)})
