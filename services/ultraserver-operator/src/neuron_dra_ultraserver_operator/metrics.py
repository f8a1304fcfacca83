"""The operator's Prometheus metrics (served on ``/metrics`` with the process's others)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from neuron_dra_common.telemetry import Counter, Gauge, Histogram
from neuron_dra_common.ultraserver import NUSW_STATES

__all__ = ["ALLOCATION_SECONDS", "RECONCILE_ERRORS", "WORKLOADS", "WorkloadStates"]

WORKLOADS: Final = Gauge(
    "neuron_dra_operator_workloads",
    "NeuronUltraServerWorkloads by state (one not looked at yet counts as Pending)",
    ["state"],
)
RECONCILE_ERRORS: Final = Counter(
    "neuron_dra_operator_reconcile_errors",
    "Reconciles of a NeuronUltraServerWorkload that failed and are retried",
)
ALLOCATION_SECONDS: Final = Histogram(
    "neuron_dra_operator_allocation_seconds",
    "Seconds from a NeuronUltraServerWorkload's creation to its first Allocated state",
    buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
)


class WorkloadStates:
    """Keeps :data:`WORKLOADS` equal to the states of the workloads the informer holds."""

    def __init__(self) -> None:
        self._states: dict[str, str] = {}
        for state in NUSW_STATES:
            WORKLOADS.labels(state=state).set(0)

    def update(self, key: str, state: str | None) -> None:
        """``key`` is now in ``state`` (``None``: it is gone)."""
        if state is None:
            self._states.pop(key, None)
        else:
            self._states[key] = state or "Pending"
        self._publish(self._states)

    @staticmethod
    def _publish(states: Mapping[str, str]) -> None:
        counts = dict.fromkeys(NUSW_STATES, 0)
        for state in states.values():
            counts[state] = counts.get(state, 0) + 1
        for state, count in counts.items():
            WORKLOADS.labels(state=state).set(count)
