"""Handler durations counted in place reach the Prometheus histogram as if observed one by one."""

from __future__ import annotations

from bisect import bisect_left

from neuron_dra_common.bus import metrics
from prometheus_client import REGISTRY


def _bucket(consumer: str, le: str) -> float:
    value = REGISTRY.get_sample_value(
        "neuron_bus_handle_seconds_bucket", {"consumer": consumer, "le": le}
    )
    assert value is not None
    return value


def test_counted_durations_land_in_the_buckets_observe_would_use() -> None:
    times = metrics.HandleTimes("test-bulk")
    reference = metrics.HANDLE_SECONDS.labels("test-observed")
    durations = [0.0001, 0.0005, 0.0007, 0.002, 0.2, 45.0, 0.0]
    for seconds in durations:
        times.counts[bisect_left(times.bounds, seconds)] += 1
        times.total += seconds
        reference.observe(seconds)
    times.flush()
    times.flush()  # nothing new: changes nothing
    assert times.bounds[-1] == float("inf")
    for le in ("0.0005", "0.001", "0.005", "0.5", "30.0", "+Inf"):
        assert _bucket("test-bulk", le) == _bucket("test-observed", le), le
    total = REGISTRY.get_sample_value("neuron_bus_handle_seconds_sum", {"consumer": "test-bulk"})
    assert total == sum(durations)
    count = REGISTRY.get_sample_value("neuron_bus_handle_seconds_count", {"consumer": "test-bulk"})
    assert count == len(durations)
