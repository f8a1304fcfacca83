"""Metrics: the product's metrics are prometheus_client's, made through this module.

Every metric of the product is named ``neuron_dra_*`` (AWS's neuron-monitor exports
``neuron_*``, so the two never collide in one Prometheus) with Prometheus's unit suffixes.
A service makes its metrics with :class:`Counter` (exposed as ``<name>_total``),
:class:`Gauge` and :class:`Histogram`, all registered in :data:`REGISTRY`, which ``/metrics``
serves (:func:`expose`).

What a scrape gets is decided here, once per process:

- no ``*_created`` series: Prometheus's text format has no place for them but as gauges of
  their own, one more series per counter and histogram child that no rule or dashboard reads;
- the ``process_*`` series (memory, CPU, file descriptors, start time) and ``python_info``;
- not the ``python_gc_*`` series: no rule or dashboard reads them, and every process of the
  fleet would carry them.

>>> SENT = Counter("neuron_dra_example_sent", "Messages sent", ["kind"])
>>> SENT.labels("inventory").inc()
>>> REGISTRY.get_sample_value("neuron_dra_example_sent_total", {"kind": "inventory"})
1.0
>>> REGISTRY.unregister(SENT)
"""

from __future__ import annotations

import contextlib
import platform
from typing import Final

from prometheus_client import (
    CONTENT_TYPE_PLAIN_0_0_4,
    GC_COLLECTOR,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from neuron_dra_common.telemetry.tracing import service_version

__all__ = [
    "BUILD_INFO",
    "CONTENT_TYPE",
    "PREFIX",
    "REGISTRY",
    "CollectorRegistry",
    "Counter",
    "Gauge",
    "Histogram",
    "expose",
    "publish_build_info",
]

PREFIX: Final = "neuron_dra_"

#: The Content-Type of what :func:`expose` returns: Prometheus's text format 0.0.4, which
#: every Prometheus and promtool reads.
CONTENT_TYPE: Final = CONTENT_TYPE_PLAIN_0_0_4

disable_created_metrics()  # type: ignore[no-untyped-call]  # it has no annotations
with contextlib.suppress(KeyError):  # already gone: this module was loaded again
    REGISTRY.unregister(GC_COLLECTOR)


def expose(registry: CollectorRegistry = REGISTRY) -> bytes:
    """The text every scrape of ``/metrics`` gets (:data:`CONTENT_TYPE`)."""
    return generate_latest(registry)


BUILD_INFO: Final = Gauge(
    "neuron_dra_build_info",
    "Always 1; the labels say which service runs which version (join on instance)",
    ["service", "version", "python_version"],
)


def publish_build_info(service: str) -> None:
    """Set ``neuron_dra_build_info{service, version, python_version} 1`` for this process."""
    BUILD_INFO.labels(service, service_version(service), platform.python_version()).set(1)
