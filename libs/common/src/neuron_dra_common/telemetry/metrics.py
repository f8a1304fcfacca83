"""Metrics every service exports, whatever it does.

Every metric of the product is named ``neuron_dra_*`` (AWS's neuron-monitor exports
``neuron_*``, so the two never collide in one Prometheus) with Prometheus's unit suffixes.
"""

from __future__ import annotations

import platform
from typing import Final

from neuron_dra_common.telemetry.registry import Gauge
from neuron_dra_common.telemetry.tracing import service_version

__all__ = ["BUILD_INFO", "PREFIX", "publish_build_info"]

PREFIX: Final = "neuron_dra_"

BUILD_INFO: Final = Gauge(
    "neuron_dra_build_info",
    "Always 1; the labels say which service runs which version (join on instance)",
    ["service", "version", "python_version"],
)


def publish_build_info(service: str) -> None:
    """Set ``neuron_dra_build_info{service, version, python_version} 1`` for this process."""
    BUILD_INFO.labels(service, service_version(service), platform.python_version()).set(1)
