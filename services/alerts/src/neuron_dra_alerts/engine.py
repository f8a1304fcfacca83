"""The alerts engine: apply the rules to each event, record the change, tell Alertmanager.

Exactly one outcome per alert change, across crashes and restarts:

1. the rules say what an event means for an alert (:mod:`neuron_dra_alerts.rules`);
2. a change is recorded first, as an :class:`AlertStateChanged` on ``NEURON_ALERTS`` (latest
   per alert), carrying the audit sequence of the event that caused it; only then is it sent,
   and only after that is the event acknowledged;
3. after a restart the state is read back from ``NEURON_ALERTS`` and every firing alert is
   sent again at once; an event delivered again (its ack was lost) is recognised by its
   sequence: the one that made the current state re-sends that state, an older one changes
   nothing, so a resolved alert is never sent as firing again.

Alertmanager being down does not hold up the stream: the change is recorded and sent by the
periodic re-send, which also keeps every firing alert's ``endsAt`` ahead of now.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Protocol

from neuron_dra_common.bus import Delivery
from neuron_dra_common.events import (
    AlertStateChanged,
    AllocationDecided,
    AllocationReleased,
    AnyEvent,
    Event,
    ObjectRef,
)
from neuron_dra_common.runtime.faults import CrashPoint, no_crash
from neuron_dra_common.telemetry import Counter, Gauge

from neuron_dra_alerts.alertmanager import AlertmanagerError, PostableAlert
from neuron_dra_alerts.rules import Desired, evaluate

__all__ = ["CRASH_STEPS", "CRASH_VARIABLE", "AlertSink", "Alerter", "Recorder"]

#: For crash tests: ``NEURON_DRA_ALERTS_CRASH_AT=after-send`` kills the process (SIGKILL) once
#: a change was recorded and sent, before its event is acknowledged; ``after-record`` once it
#: was recorded, before it was sent.
CRASH_VARIABLE = "NEURON_DRA_ALERTS_CRASH_AT"
CRASH_STEPS = ("after-record", "after-send")

log = logging.getLogger(__name__)

CHANGES = Counter(
    "neuron_dra_alerts_changes",
    "Alerts fired or resolved, by alert name and status",
    ["alertname", "status"],
)
SENDS = Counter(
    "neuron_dra_alerts_sends", "Posts to Alertmanager, by outcome (ok, failed)", ["outcome"]
)
FIRING = Gauge("neuron_dra_alerts_firing", "Alerts firing now, by alert name", ["alertname"])


class AlertSink(Protocol):
    async def post(self, alerts: Sequence[PostableAlert]) -> None: ...


Recorder = Callable[[AlertStateChanged, str], Awaitable[object]]


class Alerter:
    """Holds every alert's latest state and who holds each node; handles audit events."""

    def __init__(
        self,
        *,
        sink: AlertSink,
        record: Recorder,
        ttl_seconds: float,
        generator_url: str = "",
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        crash: CrashPoint = no_crash,
    ) -> None:
        self._crash = crash
        self._sink = sink
        self._record = record
        self._ttl = timedelta(seconds=ttl_seconds)
        self._generator_url = generator_url
        self._now = clock
        self.state: dict[str, AlertStateChanged] = {}
        self.holders: dict[str, ObjectRef] = {}
        #: Keys whose latest state Alertmanager has not confirmed yet.
        self.unsent: set[str] = set()
        self._lock = asyncio.Lock()

    # --- rebuilding ----------------------------------------------------------------------

    def restore(self, states: Iterable[AnyEvent], allocations: Iterable[AnyEvent]) -> None:
        """Load the recorded alert states and the allocations (both in stream order)."""
        for event in allocations:
            self.track(event)
        for event in states:
            if isinstance(event, AlertStateChanged):
                self.state[event.key] = event
                if event.status == "firing":
                    self.unsent.add(event.key)
        self._gauge()

    def track(self, event: AnyEvent) -> None:
        """Follow which workload holds which node (for the alerts' workload labels)."""
        if isinstance(event, AllocationDecided) and event.granted:
            for node, ref in list(self.holders.items()):
                if ref.uid == event.workload.uid and ref.name == event.workload.name:
                    del self.holders[node]
            for node in event.nodes:
                self.holders[node] = event.workload
        elif isinstance(event, AllocationReleased):
            for node, ref in list(self.holders.items()):
                if ref.name == event.workload.name and ref.namespace == event.workload.namespace:
                    del self.holders[node]

    # --- the consumer's handler ------------------------------------------------------------

    async def handle(self, event: AnyEvent, delivery: Delivery) -> None:
        self.track(event)
        for desired in evaluate(event, self.holders):
            await self.apply(desired, sequence=delivery.stream_sequence, cause=delivery.msg_id)

    async def apply(self, desired: Desired, *, sequence: int, cause: str) -> None:
        """Move one alert to ``desired`` if ``sequence`` is newer than its recorded state."""
        async with self._lock:
            current = self.state.get(desired.key)
            if current is not None and sequence < current.cause_sequence:
                return  # an older event delivered again: already superseded
            if current is not None and sequence == current.cause_sequence:
                await self._send([current])  # delivered again: make sure it was sent
                return
            changes = self._changes(current, desired, sequence=sequence, cause=cause)
            for change in changes:
                await self._record(change, _msg_id(change))
                self.state[change.key] = change
                self.unsent.add(change.key)
                CHANGES.labels(change.alertname, change.status).inc()
                log.info(
                    "alert %s",
                    change.status,
                    extra={"alert": change.key, "labels": change.labels, "cause": cause},
                )
            if changes:
                self._gauge()
                self._crash("after-record")
                await self._send(changes)
                self._crash("after-send")

    def _changes(
        self, current: AlertStateChanged | None, desired: Desired, *, sequence: int, cause: str
    ) -> list[AlertStateChanged]:
        now = self._now()
        firing = current is not None and current.status == "firing"
        if desired.status == "resolved":
            if current is None or not firing:
                return []
            return [_resolved(current, now=now, sequence=sequence, cause=cause)]
        if (
            current is not None
            and firing
            and current.labels == desired.labels
            and current.annotations == desired.annotations
        ):
            return []  # the same alert, still firing: the re-send keeps it
        out: list[AlertStateChanged] = []
        if current is not None and firing and current.labels != desired.labels:
            # Another label set is another alert to Alertmanager: end the old one.
            out.append(_resolved(current, now=now, sequence=sequence, cause=cause))
        starts = current.starts_at if firing and current is not None and not out else now
        out.append(
            AlertStateChanged(
                key=desired.key,
                alertname=desired.alertname,
                status="firing",
                labels=desired.labels,
                annotations=desired.annotations,
                starts_at=starts,
                cause_sequence=sequence,
                cause_id=cause,
            )
        )
        return out

    # --- sending ---------------------------------------------------------------------------

    def postable(self, state: AlertStateChanged) -> PostableAlert:
        now = self._now()
        ends = state.ends_at if state.status == "resolved" and state.ends_at else now + self._ttl
        return PostableAlert(
            labels=state.labels,
            annotations=state.annotations,
            starts_at=state.starts_at,
            ends_at=ends,
            generator_url=self._generator_url,
        )

    async def _send(self, states: Sequence[AlertStateChanged]) -> bool:
        try:
            await self._sink.post([self.postable(s) for s in states])
        except AlertmanagerError as exc:
            SENDS.labels("failed").inc()
            log.warning(
                "alertmanager did not take the alerts, re-sent later",
                extra={
                    "error": str(exc),
                    "alerts": [s.key for s in states],
                },
            )
            return False
        SENDS.labels("ok").inc()
        for s in states:
            if self.state.get(s.key) is s:
                self.unsent.discard(s.key)
        return True

    async def resend(self) -> bool:
        """Send every firing alert (endsAt moved ahead) and every change not yet sent."""
        async with self._lock:
            due = [s for k, s in self.state.items() if s.status == "firing" or k in self.unsent]
            if not due:
                return True
            return await self._send(due)

    def firing(self) -> list[AlertStateChanged]:
        return [s for s in self.state.values() if s.status == "firing"]

    def _gauge(self) -> None:
        counts: dict[str, int] = {}
        for s in self.state.values():
            counts.setdefault(s.alertname, 0)
            if s.status == "firing":
                counts[s.alertname] += 1
        for name, n in counts.items():
            FIRING.labels(name).set(n)


def _resolved(
    current: AlertStateChanged, *, now: datetime, sequence: int, cause: str
) -> AlertStateChanged:
    return AlertStateChanged(
        key=current.key,
        alertname=current.alertname,
        status="resolved",
        labels=current.labels,
        annotations=current.annotations,
        starts_at=current.starts_at,
        ends_at=now,
        cause_sequence=sequence,
        cause_id=cause,
    )


def _msg_id(change: Event) -> str:
    assert isinstance(change, AlertStateChanged)
    # One record per (alert, cause, status): a retried or repeated record is stored once.
    return f"alert:{change.subject.rsplit('.', 1)[-1]}:{change.cause_sequence}:{change.status}"
