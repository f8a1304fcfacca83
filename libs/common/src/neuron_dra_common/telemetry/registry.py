"""Counters, gauges and histograms, and their Prometheus text exposition (format 0.0.4).

Every process serves its metrics on ``/metrics`` (:class:`~neuron_dra_common.runtime.http.
HealthServer`); this module holds them. It does what the product needs and nothing else, so a
node agent does not carry an HTTP server, a WSGI stack and a pushgateway client it never uses
(about 1.7 MiB of private memory in each of the fleet's Python processes):

- :class:`Counter` (exposed as ``<name>_total``), :class:`Gauge` (``set``, ``inc``, ``dec``,
  or a function read at each scrape) and :class:`Histogram` (cumulative ``_bucket``, ``_sum``,
  ``_count``), each with or without labels;
- a metric is registered in :data:`REGISTRY` when it is made (a second metric of the same name
  is refused), and :meth:`Registry.expose` renders all of them, with the ``process_*`` and
  ``python_info`` series Prometheus's client libraries export;
- :meth:`Registry.get_sample_value` reads one sample back, as a test or a benchmark does.

Updates take a lock, so a thread (a span exporter, ``asyncio.to_thread``) may count too.
"""

from __future__ import annotations

import bisect
import functools
import math
import os
import platform
import resource
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import ClassVar, Final, Self

__all__ = [
    "CONTENT_TYPE",
    "REGISTRY",
    "Counter",
    "Gauge",
    "Histogram",
    "Registry",
]

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"

#: Buckets of a histogram made without any (seconds, from 5 ms to 10 s).
DEFAULT_BUCKETS: Final = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
)

Sample = tuple[str, Mapping[str, str], float]


def _number(value: float) -> str:
    """A sample value (or a bucket's ``le``) as Prometheus's clients write it: ``+Inf``,
    ``-Inf``, ``NaN``, else Python's shortest form, in Go's exponent form from 1e6 up (as
    Prometheus's own clients write ``le="1e+06"``, so that a series keeps its labels)."""
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    text = repr(float(value))
    point = text.find(".")
    if value > 0 and point > 6:
        digits = (text[:point] + text[point + 1 :]).rstrip("0") or "0"
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{mantissa}e+{point - 1:02d}"
    return text


def _label_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _valid_name(name: str, *, label: bool = False) -> bool:
    if not name or name[0].isdigit() or (label and name.startswith("__")):
        return False
    extra = "_" if label else "_:"
    return all(c.isascii() and (c.isalnum() or c in extra) for c in name)


class Registry:
    """The metrics one ``/metrics`` endpoint serves."""

    def __init__(self, *, process: bool = False) -> None:
        self._metrics: dict[str, _Metric] = {}
        #: Every sample name a metric exposes, with the metric's name.
        self._names: dict[str, str] = {}
        self._lock = threading.Lock()
        self._process = process

    def register(self, metric: _Metric) -> None:
        """Add ``metric``; one whose name, or any sample name, another already has is refused
        (``x_total`` of a counter ``x`` and a gauge ``x_total`` would be one series)."""
        names = metric.sample_names()
        with self._lock:
            taken = sorted({self._names[n] for n in names if n in self._names})
            if metric.name in self._metrics or taken:
                raise ValueError(
                    f"metrics: {metric.name} is defined twice"
                    if metric.name in self._metrics or taken == [metric.name]
                    else f"metrics: {metric.name} would expose the series of {', '.join(taken)}"
                )
            self._metrics[metric.name] = metric
            self._names.update(dict.fromkeys(names, metric.name))

    def unregister(self, metric: _Metric) -> None:
        with self._lock:
            if self._metrics.pop(metric.name, None) is not None:
                for name in metric.sample_names():
                    self._names.pop(name, None)

    def metrics(self) -> list[_Metric]:
        with self._lock:
            return list(self._metrics.values())

    def samples(self) -> Iterator[Sample]:
        """Every sample, in the order :meth:`expose` writes them."""
        for metric in self.metrics():
            yield from metric.samples()
        if self._process:
            yield from _process_samples()

    def expose(self) -> bytes:
        """The text every scrape gets."""
        lines: list[str] = []
        for metric in self.metrics():
            lines.append(f"# HELP {metric.exposed_name} {_help(metric.documentation)}")
            lines.append(f"# TYPE {metric.exposed_name} {metric.kind}")
            lines.extend(_line(sample) for sample in metric.samples())
        if self._process:
            # Read once: every process series of one scrape is of the same moment.
            process = _process_samples()
            for name, kind, text in _PROCESS_FAMILIES:
                lines.append(f"# HELP {name} {text}")
                lines.append(f"# TYPE {name} {kind}")
                lines.extend(_line(s) for s in process if s[0] == name)
        lines.append("")
        return "\n".join(lines).encode()

    def get_sample_value(self, name: str, labels: Mapping[str, str] | None = None) -> float | None:
        """The value of the sample ``name{labels}`` (``None``: there is none)."""
        wanted = dict(labels or {})
        for sample_name, sample_labels, value in self.samples():
            if sample_name == name and dict(sample_labels) == wanted:
                return value
        return None


def _line(sample: Sample) -> str:
    name, labels, value = sample
    if not labels:
        return f"{name} {_number(value)}"
    text = ",".join(f'{k}="{_label_value(v)}"' for k, v in labels.items())
    return f"{name}{{{text}}} {_number(value)}"


#: The registry every metric joins unless told otherwise; ``/metrics`` serves it.
REGISTRY: Final = Registry(process=True)


class _Metric:
    """One metric family: either a single value or, with label names, a child per label set."""

    kind: ClassVar[str]
    _suffix: ClassVar[str] = ""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        registry: Registry | None = REGISTRY,
    ) -> None:
        if not _valid_name(name):
            raise ValueError(f"metrics: {name!r} is not a valid metric name")
        for label in labelnames:
            if not _valid_name(label, label=True) or label == "le":
                raise ValueError(f"metrics: {name}: {label!r} is not a valid label name")
        self.name = name.removesuffix(self._suffix) if self._suffix else name
        self.exposed_name = self.name + self._suffix
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._lock = threading.Lock()
        self._children: dict[tuple[str, ...], Self] = {}
        self._value = 0.0
        if registry is not None:
            registry.register(self)

    def _child(self) -> Self:
        """A value of this family for one label set (same kind, not registered)."""
        return type(self)(self.name, self.documentation, registry=None)

    def labels(self, *values: object, **named: object) -> Self:
        """The value for these label values (given in order, or by name); made on first use."""
        if not self.labelnames:
            raise ValueError(f"metrics: {self.name} has no labels")
        if values and named:
            raise ValueError(
                f"metrics: {self.name}: give label values in order or by name, not both"
            )
        if named:
            if set(named) != set(self.labelnames):
                raise ValueError(
                    f"metrics: {self.name} takes the labels {', '.join(self.labelnames)}, "
                    f"not {', '.join(sorted(named))}"
                )
            values = tuple(named[n] for n in self.labelnames)
        if len(values) != len(self.labelnames):
            raise ValueError(
                f"metrics: {self.name} takes {len(self.labelnames)} label values "
                f"({', '.join(self.labelnames)}), not {len(values)}"
            )
        key = tuple(str(v) for v in values)
        child = self._children.get(key)
        if child is None:
            with self._lock:
                child = self._children.setdefault(key, self._child())
        return child

    def _unlabelled(self) -> None:
        if self.labelnames:
            raise ValueError(
                f"metrics: {self.name} has labels ({', '.join(self.labelnames)}): "
                "call .labels(...) first"
            )

    def _own_samples(self, labels: Mapping[str, str]) -> Iterable[Sample]:
        raise NotImplementedError

    def sample_names(self) -> tuple[str, ...]:
        """The names of the samples this metric exposes."""
        return (self.exposed_name,)

    def samples(self) -> Iterator[Sample]:
        if not self.labelnames:
            yield from self._own_samples({})
            return
        with self._lock:
            children = list(self._children.items())
        for key, child in children:
            yield from child._own_samples(dict(zip(self.labelnames, key, strict=True)))


class Counter(_Metric):
    """A count that only goes up; exposed as ``<name>_total``."""

    kind = "counter"
    _suffix = "_total"

    def inc(self, amount: float = 1) -> None:
        self._unlabelled()
        if amount < 0:
            raise ValueError(f"metrics: counter {self.name} cannot go down ({amount})")
        with self._lock:
            self._value += amount

    def _own_samples(self, labels: Mapping[str, str]) -> Iterable[Sample]:
        return ((self.exposed_name, labels, self._value),)


class Gauge(_Metric):
    """A value that goes up and down, or is read from a function at each scrape."""

    kind = "gauge"

    _function: Callable[[], float] | None = None

    def set(self, value: float) -> None:
        self._unlabelled()
        with self._lock:
            self._value = float(value)

    def inc(self, amount: float = 1) -> None:
        self._unlabelled()
        with self._lock:
            self._value += amount

    def dec(self, amount: float = 1) -> None:
        self.inc(-amount)

    def set_function(self, function: Callable[[], float]) -> None:
        """Read the value from ``function`` at every scrape from now on."""
        self._unlabelled()
        self._function = function

    def _own_samples(self, labels: Mapping[str, str]) -> Iterable[Sample]:
        value = self._function() if self._function is not None else self._value
        return ((self.name, labels, float(value)),)


class Histogram(_Metric):
    """Observations counted into cumulative buckets, with their sum and count."""

    kind = "histogram"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        buckets: Sequence[float] = DEFAULT_BUCKETS,
        registry: Registry | None = REGISTRY,
    ) -> None:
        bounds = [float(b) for b in buckets]
        if bounds and bounds[-1] != math.inf:
            bounds.append(math.inf)
        if len(bounds) < 2 or bounds != sorted(set(bounds)):
            raise ValueError(f"metrics: {name}: buckets must rise and there must be one at least")
        self.bounds = tuple(bounds)
        self._counts = [0] * len(self.bounds)
        self._sum = 0.0
        # Registered last: complete before a scrape can see it.
        super().__init__(name, documentation, labelnames, registry=registry)

    def sample_names(self) -> tuple[str, ...]:
        return (f"{self.name}_bucket", f"{self.name}_count", f"{self.name}_sum")

    def _child(self) -> Self:
        return type(self)(self.name, self.documentation, buckets=self.bounds, registry=None)

    def observe(self, value: float) -> None:
        self._unlabelled()
        # NaN is above every bound but +Inf's.
        last = len(self.bounds) - 1
        at = last if math.isnan(value) else min(bisect.bisect_left(self.bounds, value), last)
        with self._lock:
            self._counts[at] += 1
            self._sum += value

    def _own_samples(self, labels: Mapping[str, str]) -> Iterable[Sample]:
        with self._lock:
            counts, total = list(self._counts), self._sum
        out: list[Sample] = []
        running = 0
        for bound, count in zip(self.bounds, counts, strict=True):
            running += count
            out.append((f"{self.name}_bucket", {**labels, "le": _number(bound)}, float(running)))
        out.append((f"{self.name}_count", labels, float(running)))
        out.append((f"{self.name}_sum", labels, total))
        return out


_PROCESS_FAMILIES: Final = (
    ("python_info", "gauge", "Python platform information"),
    ("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes."),
    ("process_resident_memory_bytes", "gauge", "Resident memory size in bytes."),
    (
        "process_start_time_seconds",
        "gauge",
        "Start time of the process since unix epoch in seconds.",
    ),
    ("process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds."),
    ("process_open_fds", "gauge", "Number of open file descriptors."),
    ("process_max_fds", "gauge", "Maximum number of open file descriptors."),
)


@functools.cache
def _boot_time() -> float:
    """When the machine booted (``/proc/stat``), read once: it does not change."""
    with open("/proc/stat", encoding="ascii") as f:
        for line in f:
            if line.startswith("btime "):
                return float(line.split()[1])
    return 0.0


_TICKS: Final = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE: Final = resource.getpagesize()


def _process_samples() -> list[Sample]:
    """The process's own series (Linux; the ``python_info`` series alone elsewhere)."""
    info = sys.version_info
    out: list[Sample] = [
        (
            "python_info",
            {
                "implementation": platform.python_implementation(),
                "major": str(info.major),
                "minor": str(info.minor),
                "patchlevel": str(info.micro),
                "version": f"{info.major}.{info.minor}.{info.micro}",
            },
            1.0,
        )
    ]
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            # The command name (field 2) may hold spaces; the fields after it do not.
            fields = f.read().rsplit(")", 1)[1].split()
        fds = len(os.listdir("/proc/self/fd"))
        boot = _boot_time()
    except OSError:
        return out
    # Fields 3.. of proc(5) from index 0: utime 11, stime 12, starttime 19, vsize 20, rss 21.
    out += [
        ("process_virtual_memory_bytes", {}, float(fields[20])),
        ("process_resident_memory_bytes", {}, float(int(fields[21]) * _PAGE)),
        ("process_start_time_seconds", {}, boot + int(fields[19]) / _TICKS),
        ("process_cpu_seconds_total", {}, (int(fields[11]) + int(fields[12])) / _TICKS),
        ("process_open_fds", {}, float(fds)),
        ("process_max_fds", {}, float(resource.getrlimit(resource.RLIMIT_NOFILE)[0])),
    ]
    return out
