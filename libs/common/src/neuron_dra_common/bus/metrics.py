"""Prometheus metrics of the bus, defined once per process."""

from __future__ import annotations

from typing import Final

from prometheus_client import Counter, Histogram

__all__ = [
    "DEAD_LETTERS",
    "HANDLE_SECONDS",
    "MESSAGES",
    "PUBLISHED",
    "PUBLISH_RETRIES",
    "HandleTimes",
]

MESSAGES: Final = Counter(
    "neuron_bus_messages",
    "Messages a consumer finished with, by outcome "
    "(acked, retried, duplicate, dead_lettered, requeued)",
    ["consumer", "outcome"],
)
DEAD_LETTERS: Final = Counter(
    "neuron_bus_dead_letters",
    "Messages sent to the dead-letter subject, by why (decode, handler, permanent, exhausted)",
    ["consumer", "kind"],
)
HANDLE_SECONDS: Final = Histogram(
    "neuron_bus_handle_seconds",
    "Time a handler took for one message",
    ["consumer"],
    buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0),
)
PUBLISHED: Final = Counter(
    "neuron_bus_published",
    "Events published and acknowledged by JetStream, by event type",
    ["type"],
)
PUBLISH_RETRIES: Final = Counter(
    "neuron_bus_publish_retries",
    "Publish attempts repeated after a timeout or a lost connection",
)


class HandleTimes:
    """One consumer's handler durations, counted in place and added to ``HANDLE_SECONDS`` in bulk.

    ``Histogram.observe`` takes a lock and walks the buckets for each value, about a
    microsecond; at tens of thousands of messages a second the runner instead counts
    ``counts[bisect_left(bounds, seconds)] += 1`` and ``total += seconds`` itself and calls
    :meth:`flush` once per turn of the event loop. This adds to the histogram child's own
    bucket and sum values (``_upper_bounds``, ``_buckets``, ``_sum`` of the pinned
    prometheus-client 0.26); ``tests/unit/bus/test_metrics.py`` fails if they change.
    """

    __slots__ = ("_child", "bounds", "counts", "total")

    def __init__(self, consumer: str) -> None:
        self._child = HANDLE_SECONDS.labels(consumer)
        #: Upper bounds of the buckets, ``+Inf`` last, so every value has a bucket.
        self.bounds: tuple[float, ...] = tuple(self._child._upper_bounds)
        self.counts = [0] * len(self.bounds)
        self.total = 0.0

    def flush(self) -> None:
        """Add what was counted since the last flush to the histogram."""
        counts = self.counts
        if not any(counts):
            return
        buckets = self._child._buckets
        for index, count in enumerate(counts):
            if count:
                buckets[index].inc(count)
                counts[index] = 0
        self._child._sum.inc(self.total)
        self.total = 0.0
