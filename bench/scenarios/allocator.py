"""Allocator: placement decisions at 10,000 UltraServers, and admission under churn.

1. Decisions: a fleet of 10,000 UltraServers (40,000 nodes) kept near half full by a stream
   of places and releases (sizes 1, 2, 4; one or two units); every place is timed. Best fit
   against first fit on the same fleet and the same request sequence.
2. Admission: a smaller fleet under churn (requests arrive one per step and hold their nodes
   for a random time, offered load equal to the fleet, which keeps it about 90% busy); how
   many workloads each strategy admits from the same arrivals.

Goals (issue 7): decision p99 at most 5 ms at 10,000 UltraServers; best fit admits at least
15% more workloads than first fit at 90% load. The end-to-end figure (apply -> Allocated on
the stack at 100 UltraServers) is not part of this scenario yet.
"""

from __future__ import annotations

import random
import time
from typing import NamedTuple

from neuron_dra_topology_allocator.placement import Fleet, Request, Strategy

from bench.harness import Figure, Report, percentile

__all__ = ["run"]

TYPE = "trn2u.48xlarge"
SIZES = (1, 2, 4)
WEIGHTS = (0.4, 0.35, 0.25)


def _fleet(servers: int) -> Fleet:
    fleet = Fleet()
    for u in range(servers):
        for i in range(4):
            fleet.upsert_node(
                f"us{u:05d}-n{i}",
                ultraserver=f"us-{u:05d}",
                instance_type=TYPE,
                node_id=i,
                modes=(1, 2, 3, 4),
                server_id_2=f"us-{u:05d}-p{i // 2}",
            )
    return fleet


def _decisions(strategy: Strategy, *, servers: int, n: int, seed: int) -> list[float]:
    fleet = _fleet(servers)
    rng = random.Random(seed)
    held: list[str] = []
    target = servers * 4 // 2
    times: list[float] = []
    for i in range(n):
        # Keep the fleet near half full: release while above, place while below.
        while held and (servers * 4 - fleet.free_nodes()) > target:
            fleet.release(held.pop(rng.randrange(len(held))))
        size = rng.choices(SIZES, WEIGHTS)[0]
        request = Request(workload=f"b/w{i}", uid=f"w{i}", size=size, count=rng.choice((1, 2)))
        started = time.perf_counter()
        decision = fleet.place(request, strategy=strategy)
        times.append(time.perf_counter() - started)
        if decision.granted:
            held.append(request.uid)
    return times


class _Admission(NamedTuple):
    admitted: int
    utilization: float
    per_size: dict[int, tuple[int, int]]  # size -> (admitted, arrived)


def _admission(strategy: Strategy, *, servers: int, steps: int, seed: int) -> _Admission:
    fleet = _fleet(servers)
    per_size = {s: [0, 0] for s in SIZES}
    rng = random.Random(seed)
    mean_size = sum(s * w for s, w in zip(SIZES, WEIGHTS, strict=True))
    # Offered load equal to the fleet: what is admitted then keeps it about 90% busy.
    lifetime = servers * 4 / mean_size
    ends: dict[int, list[str]] = {}
    admitted = 0
    busy = 0
    for step in range(steps):
        for uid in ends.pop(step, ()):
            fleet.release(uid)
        size = rng.choices(SIZES, WEIGHTS)[0]
        hold = max(1, int(rng.expovariate(1 / lifetime)))
        uid = f"w{step}"
        per_size[size][1] += 1
        if fleet.place(Request(workload=f"b/{uid}", uid=uid, size=size), strategy=strategy).granted:
            admitted += 1
            per_size[size][0] += 1
            ends.setdefault(step + hold, []).append(uid)
        busy += servers * 4 - fleet.free_nodes()
    return _Admission(
        admitted, busy / steps / (servers * 4), {s: (a, n) for s, (a, n) in per_size.items()}
    )


def run(*, quick: bool = False) -> Report:
    servers = 10_000
    n = 2_000 if quick else 10_000
    report = Report(name="allocator")
    measured = {s: _decisions(s, servers=servers, n=n, seed=1) for s in Strategy}
    best, first = measured[Strategy.BEST_FIT], measured[Strategy.FIRST_FIT]
    report.figures += [
        Figure(
            name=f"decisions/s at {servers:,} UltraServers",
            unit="1/s",
            value=len(best) / sum(best),
            baseline=len(first) / sum(first),
            baseline_name="first fit",
        ),
        Figure(
            name="decision p99",
            unit="ms",
            value=percentile(best, 99) * 1000,
            baseline=percentile(first, 99) * 1000,
            baseline_name="first fit",
            higher_is_better=False,
        ),
        Figure(
            name="decision p50",
            unit="ms",
            value=percentile(best, 50) * 1000,
            baseline=percentile(first, 50) * 1000,
            baseline_name="first fit",
            higher_is_better=False,
        ),
    ]
    small, steps = (200, 10_000) if quick else (500, 40_000)
    admitted = {s: _admission(s, servers=small, steps=steps, seed=7) for s in Strategy}
    report.figures.append(
        Figure(
            name=f"admitted under churn ({small} UltraServers, {steps:,} arrivals)",
            unit="workloads",
            value=admitted[Strategy.BEST_FIT].admitted,
            baseline=admitted[Strategy.FIRST_FIT].admitted,
            baseline_name="first fit",
        )
    )
    for size in SIZES:
        bf, ff = admitted[Strategy.BEST_FIT], admitted[Strategy.FIRST_FIT]
        report.figures.append(
            Figure(
                name=f"admitted under churn, topologySize {size}",
                unit="workloads",
                value=bf.per_size[size][0],
                baseline=ff.per_size[size][0],
                baseline_name="first fit",
            )
        )
    report.notes.append(
        "mean node utilization during churn: "
        + ", ".join(f"{s} {admitted[s].utilization:.0%}" for s in Strategy)
    )
    # No policy admits more than arrives: the ratio any placement could reach over first fit
    # is bounded by what first fit refused.
    ff_admitted = admitted[Strategy.FIRST_FIT].admitted
    report.notes.append(
        f"ceiling: {steps:,} arrivals, first fit admitted {ff_admitted:,} ({ff_admitted / steps:.1%}); no "
        f"policy can exceed {steps / ff_admitted:.2f}x first fit on this arrival sequence"
    )
    report.notes.append(
        f"goals: decision p99 <= 5 ms at {servers:,} UltraServers; best fit admits >= 1.15x "
        "first fit at 90% load"
    )
    return report
