"""Service runtime: uvloop, named tasks, probes and metrics, orderly shutdown."""

from neuron_dra_common.runtime.http import HealthServer, HttpLimits
from neuron_dra_common.runtime.process import Service, run, serve

__all__ = ["HealthServer", "HttpLimits", "Service", "run", "serve"]
