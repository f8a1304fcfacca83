"""Prometheus metrics of the bus, defined once per process."""

from __future__ import annotations

from typing import Final

from neuron_dra_common.telemetry import Counter, Histogram

__all__ = [
    "DEAD_LETTERS",
    "HANDLE_SECONDS",
    "MESSAGES",
    "PUBLISHED",
    "PUBLISH_RETRIES",
]

MESSAGES: Final = Counter(
    "neuron_dra_bus_messages",
    "Messages a consumer finished with, by outcome "
    "(acked, retried, duplicate, dead_lettered, requeued)",
    ["consumer", "outcome"],
)
DEAD_LETTERS: Final = Counter(
    "neuron_dra_bus_dead_letters",
    "Messages sent to the dead-letter subject, by why (decode, handler, permanent, exhausted)",
    ["consumer", "kind"],
)
HANDLE_SECONDS: Final = Histogram(
    "neuron_dra_bus_handle_seconds",
    "Time a handler took for one message",
    ["consumer"],
    buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0),
)
PUBLISHED: Final = Counter(
    "neuron_dra_bus_published",
    "Events published and acknowledged by JetStream, by event type",
    ["type"],
)
PUBLISH_RETRIES: Final = Counter(
    "neuron_dra_bus_publish_retries",
    "Publish attempts repeated after a timeout or a lost connection",
)
