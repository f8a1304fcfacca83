"""What the plugin tells the outside: metrics, spans per claim, and claim events on the bus.

:class:`ObservedPreparer` wraps the real preparer: every prepare/unprepare of a claim runs in
a span carrying the claim's namespace, name and UID (so a trace search by claim finds it),
and is counted and timed by outcome.

:class:`ClaimEvents` turns the preparer's state changes into ``ClaimPrepared`` and
``ClaimUnprepared`` events. The kubelet must never wait for the bus (its call times out at
45 s and a pod's start should not depend on NATS), so events go into a bounded queue that a
task publishes; each event's msg id is derived from the claim, the step and the claim's
preparation on the node (:mod:`~neuron_dra_kubelet_plugin.told`), so a publish repeated after
a reconnect, or a change told again, is stored once, and a claim prepared again is a new
event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Final, NamedTuple, Protocol

from neuron_dra_common.events import ClaimPrepared, ClaimUnprepared, ObjectRef
from neuron_dra_common.events.base import Event
from neuron_dra_common.telemetry import Counter, Gauge, Histogram, tracing_enabled
from opentelemetry import trace

from neuron_dra_kubelet_plugin.checkpoint import Checkpoint, ClaimEntry, ClaimState, PreparedDevice
from neuron_dra_kubelet_plugin.claims import ClaimRef
from neuron_dra_kubelet_plugin.health import Health, HealthSource
from neuron_dra_kubelet_plugin.plan import PrepareError
from neuron_dra_kubelet_plugin.preparer import Preparer
from neuron_dra_kubelet_plugin.told import Said, ToldLedger

__all__ = [
    "DURATION",
    "EVENTS_DROPPED",
    "OPERATIONS",
    "PREPARED_CLAIMS",
    "UNHEALTHY_DEVICES",
    "ClaimEvents",
    "EventSink",
    "ObservedPreparer",
    "count_unhealthy",
]

log = logging.getLogger(__name__)

OPERATIONS: Final = Counter(
    "neuron_dra_kubelet_plugin_operations",
    "Claim operations answered to the kubelet, by operation (prepare, unprepare) and outcome "
    "(ok, failed: an error for that claim, internal: a bug or an I/O failure)",
    ["operation", "outcome"],
)
# Every series exists from the start at 0, so that the first failure is an increase a rate()
# or an alert sees, not a new series.
# The children are looked up once: a labels() call costs about as much as the count itself.
_COUNTS: Final = {
    (_operation, _outcome): OPERATIONS.labels(_operation, _outcome)
    for _operation in ("prepare", "unprepare")
    for _outcome in ("ok", "failed", "internal")
}
DURATION: Final = Histogram(
    "neuron_dra_kubelet_plugin_operation_seconds",
    "Time to prepare or unprepare one claim",
    ["operation"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 45.0),
)
_DURATIONS: Final = {
    operation: DURATION.labels(operation) for operation in ("prepare", "unprepare")
}
PREPARED_CLAIMS: Final = Gauge(
    "neuron_dra_kubelet_plugin_prepared_claims", "Claims prepared on this node (checkpoint entries)"
)
EVENTS_DROPPED: Final = Counter(
    "neuron_dra_kubelet_plugin_events_dropped",
    "Claim events not published when due (the queue was full, or the bus did not take them); "
    "each is owed and told again at the plugin's next start",
)
UNHEALTHY_DEVICES: Final = Gauge(
    "neuron_dra_unhealthy_devices",
    "Devices of this node whose health, as the plugin reports it to the kubelet, is unhealthy",
)


def count_unhealthy(source: HealthSource) -> None:
    """Make ``neuron_dra_unhealthy_devices`` read ``source`` at every scrape."""
    UNHEALTHY_DEVICES.set_function(
        lambda: float(sum(1 for r in source.snapshot() if r.health is Health.UNHEALTHY))
    )


_TRACER_NAME: Final = "neuron_dra_kubelet_plugin"
#: At most this many claim events go out in one pipelined batch.
_BATCH: Final = 256
#: How long the first event of a batch waits for others (seconds). Under load (the kubelet
#: preparing many pods) a batch then carries tens of events in one write, with one wake-up
#: for its acks, instead of one event per round trip; quiet, an event waits this long (the
#: kubelet never does: it is answered before the event is published). Measured with the
#: bus's publisher against a local JetStream, the client's CPU per event is about 210 us
#: alone, 120 us in batches of 2 to 4 and 45 us in batches of 16: at the 700 events/s of
#: the prepare benchmark's 1-device lanes, 5 ms gathered 3 or 4, 25 ms gathers about 16.
_LINGER: Final = 0.025


class ObservedPreparer:
    """A :class:`Preparer` that adds a span, a count and a duration to every claim operation."""

    def __init__(self, inner: Preparer, *, tracer: trace.Tracer | None = None) -> None:
        self._inner = inner
        # A tracer handed in always records; the process-wide one only once tracing is on
        # (making spans nobody records costs more than the rest of a repeated prepare).
        self._always = tracer is not None
        self._tracer = tracer or trace.get_tracer(_TRACER_NAME)

    def _span(self, operation: str, ref: ClaimRef) -> contextlib.AbstractContextManager[trace.Span]:
        if not self._always and not tracing_enabled():
            return contextlib.nullcontext(trace.INVALID_SPAN)
        return self._tracer.start_as_current_span(
            f"{operation} claim",
            attributes={
                "k8s.namespace.name": ref.namespace,
                "k8s.resourceclaim.name": ref.name,
                "k8s.resourceclaim.uid": ref.uid,
            },
        )

    async def prepare(self, ref: ClaimRef) -> tuple[PreparedDevice, ...]:
        t0 = time.perf_counter()
        outcome = "internal"
        with self._span("prepare", ref) as span:
            try:
                devices = await self._inner.prepare(ref)
                outcome = "ok"
                span.set_attribute("neuron.devices", [d.device for d in devices])
                return devices
            except PrepareError as exc:
                outcome = "failed"
                span.set_status(trace.StatusCode.ERROR, str(exc))
                raise
            finally:
                _COUNTS["prepare", outcome].inc()
                _DURATIONS["prepare"].observe(time.perf_counter() - t0)

    async def unprepare(self, ref: ClaimRef) -> None:
        t0 = time.perf_counter()
        outcome = "internal"
        with self._span("unprepare", ref) as span:
            try:
                await self._inner.unprepare(ref)
                outcome = "ok"
            except PrepareError as exc:
                outcome = "failed"
                span.set_status(trace.StatusCode.ERROR, str(exc))
                raise
            finally:
                _COUNTS["unprepare", outcome].inc()
                _DURATIONS["unprepare"].observe(time.perf_counter() - t0)


class EventSink(Protocol):
    """Where :class:`ClaimEvents` sends events (``neuron_dra_common.bus.Publisher``)."""

    async def publish_many(
        self, events: Sequence[Event], *, msg_ids: Sequence[str] | None = None
    ) -> object: ...


class _Item(NamedTuple):
    """A queued event, and what the ledger knows it by."""

    event: Event
    said: Said
    uid: str
    generation: int


class ClaimEvents:
    """A :class:`~neuron_dra_kubelet_plugin.preparer.PrepareListener` that publishes events.

    ``run`` publishes queued events until ``stop``; with no sink attached yet (the bus is not
    connected) events wait in the queue. When the queue is full the oldest event is dropped
    and counted: the checkpoint, not the bus, is the record the plugin relies on. An event
    dropped, or queued by a process that died before publishing it, is owed in the ledger
    and told again by :meth:`tell_owed` at the next start.
    """

    def __init__(
        self,
        *,
        node: str,
        boot_id: str,
        capacity: int = 10_000,
        ledger: ToldLedger | None = None,
    ) -> None:
        self._node = node
        self._boot_id = boot_id
        self._ledger = ledger or ToldLedger(None, boot_id=boot_id)
        # ``None`` is the stop marker.
        self._queue: asyncio.Queue[_Item | None] = asyncio.Queue(maxsize=capacity)
        self._sink: EventSink | None = None
        self._sink_ready = asyncio.Event()
        self.published = 0

    def attach(self, sink: EventSink) -> None:
        """Start publishing through ``sink`` (once the bus is connected)."""
        self._sink = sink
        self._sink_ready.set()

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    def _put(self, item: _Item | None) -> None:
        if self._queue.full():
            self._queue.get_nowait()
            EVENTS_DROPPED.inc()
        self._queue.put_nowait(item)

    def _claim(self, entry: ClaimEntry) -> ObjectRef:
        return ObjectRef(namespace=entry.namespace, name=entry.name, uid=entry.uid)

    def prepared(self, entry: ClaimEntry) -> None:
        PREPARED_CLAIMS.inc()
        self._tell_prepared(entry, again=False)

    def told_prepared(self, entry: ClaimEntry) -> None:
        self._tell_prepared(entry, again=True)

    def _tell_prepared(self, entry: ClaimEntry, *, again: bool) -> None:
        event = ClaimPrepared(
            node=self._node,
            claim=self._claim(entry),
            devices=tuple(d.device for d in entry.devices),
            cdi_devices=tuple(i for d in entry.devices for i in d.cdi_device_ids),
            admin_access=tuple(d.device for d in entry.devices if d.admin_access),
        )
        generation = self._ledger.prepared(
            entry.uid, again=again, namespace=entry.namespace, name=entry.name
        )
        self._put(_Item(event, "prepared", entry.uid, generation))

    def unprepared(self, entry: ClaimEntry) -> None:
        PREPARED_CLAIMS.dec()
        event = ClaimUnprepared(
            node=self._node,
            claim=self._claim(entry),
            devices=tuple(d.device for d in entry.devices),
        )
        generation = self._ledger.unprepared(entry.uid, namespace=entry.namespace, name=entry.name)
        self._put(_Item(event, "unprepared", entry.uid, generation))

    def told_unprepared(self, ref: ClaimRef) -> None:
        # Its devices went with its entry; the event's id is the one it had.
        claim = ObjectRef(namespace=ref.namespace, name=ref.name, uid=ref.uid)
        event = ClaimUnprepared(node=self._node, claim=claim, devices=())
        generation = self._ledger.unprepared(ref.uid, namespace=ref.namespace, name=ref.name)
        self._put(_Item(event, "unprepared", ref.uid, generation))

    def tell_owed(self, checkpoint: Checkpoint) -> int:
        """Tell what the bus does not have: a claim whose last event was never published, or
        whose state on disk is not what was last told of it (a process died between the
        disk and the ledger). Under the ids they had, or the next preparation's; returns how
        many. Claims the ledger does not know (prepared by a release before it) are left."""
        told = 0
        for last in self._ledger.told():
            entry = checkpoint.claims.get(last.uid)
            if entry is not None and entry.state is ClaimState.PREPARE_COMPLETED:
                if last.said != "prepared" or not last.published:
                    self.told_prepared(entry)
                    told += 1
            elif last.said != "unprepared" or not last.published:
                self.told_unprepared(
                    ClaimRef(namespace=last.namespace, name=last.name, uid=last.uid)
                )
                told += 1
        return told

    def _id(self, item: _Item) -> str:
        """The event's id: a claim's first preparation since boot has the id release 0.1.0
        gave it; each later one adds its generation."""
        base = f"claim-{item.said}/{self._node}/{item.uid}/{self._boot_id}"
        return base if item.generation == 1 else f"{base}/{item.generation}"

    def stop(self) -> None:
        """Publish what is queued, then let :meth:`run` return."""
        # Wake a run() that waits for the first sink or the next event.
        self._sink_ready.set()
        self._put(None)

    async def run(self) -> None:
        await self._sink_ready.wait()
        while True:
            # Whatever queued up while the last batch was in flight goes out as one
            # pipelined batch (its acks awaited together), in order.
            batch = [await self._queue.get()]
            if batch[-1] is not None and self._queue.qsize() < _BATCH:
                await asyncio.sleep(_LINGER)
            while len(batch) < _BATCH and not self._queue.empty() and batch[-1] is not None:
                batch.append(self._queue.get_nowait())
            items = [item for item in batch if item is not None]
            if self._sink is None:
                return
            if items:
                await self._publish(self._sink, items)
            if batch[-1] is None:
                self._ledger.flush()
                return

    async def _publish(self, sink: EventSink, items: list[_Item]) -> None:
        msg_ids = [self._id(item) for item in items]
        try:
            await sink.publish_many([item.event for item in items], msg_ids=msg_ids)
        except Exception as exc:  # a lost event must never stop the plugin
            EVENTS_DROPPED.inc(len(items))
            log.warning(
                "claim events not published; owed, told again at the next start",
                extra={
                    "types": sorted({item.event.event_type() for item in items}),
                    "msg_ids": msg_ids,
                    "error": repr(exc),
                },
            )
            return
        self.published += len(items)
        self._ledger.published((item.uid, item.generation, item.said) for item in items)
