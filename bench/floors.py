"""``python -m bench.floors [--rounds N] [--cycles N] [MODE...]``: what serving the DRA
socket costs in Python before any work, per way of serving it (:mod:`bench.grpc_floor`).

Every mode's server answers every claim from memory; the load is the prepare benchmark's
1-device throughput run (16 lanes, each a prepare then an unprepare per cycle, one claim per
call, from the same ``grpc.aio`` client). Modes take turns within every round (the order
swapped every round), so the machine's load hits them alike. Printed per mode: the server
process's CPU per cycle (all its threads, and its main thread alone), the client's, and
cycles per second (median of the rounds).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path

from bench.grpc_floor import MODES
from bench.scenarios.prepare import DEVICES, Caller, Plugin, _cpu_seconds, _start_floor, _stop


def _main_thread_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/task/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


async def _measure(plugins: list[Plugin], *, rounds: int, cycles: int) -> dict[str, list[float]]:
    per_lane = max(1, cycles // DEVICES)
    callers = [Caller(p) for p in plugins]
    out: dict[str, list[float]] = {}
    try:
        for caller in callers:
            await caller.cycles(1, 0, 20)
            await caller.throughput(1, per_lane)
        for r in range(rounds):
            for caller in callers if r % 2 == 0 else callers[::-1]:
                pid = caller.plugin.proc.pid
                cpu0, main0, own0 = _cpu_seconds({"s": pid})["s"], _main_thread_cpu(pid), None
                own0 = time.process_time()
                rate = await caller.throughput(1, per_lane)
                own = time.process_time() - own0
                cpu = _cpu_seconds({"s": pid})["s"] - cpu0
                main = _main_thread_cpu(pid) - main0
                n = per_lane * DEVICES
                row = out.setdefault(caller.plugin.label, [0.0, 0.0, 0.0, 0.0])
                row[0] += cpu / n
                row[1] += main / n
                row[2] += own / n
                out.setdefault(caller.plugin.label + " rates", []).append(rate)
    finally:
        for caller in callers:
            await caller.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.floors", description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cycles", type=int, default=1600, help="cycles per mode per round")
    parser.add_argument("modes", nargs="*", default=list(MODES))
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bfl-", dir="/tmp"))
    plugins: list[Plugin] = []
    try:
        per_lane = 8
        for i, mode in enumerate(args.modes):
            plugins.append(_start_floor(tmp / str(i), per_lane, mode))
        results = asyncio.run(_measure(plugins, rounds=args.rounds, cycles=args.cycles))
    finally:
        for plugin in plugins:
            _stop(plugin.proc)
        shutil.rmtree(tmp, ignore_errors=True)
    ms = 1000.0 / args.rounds
    print(f"{'server':28} {'CPU ms/cycle':>12} {'main thread':>12} {'client':>8} {'cycles/s':>9}")
    for plugin in plugins:
        cpu, main_, own, _ = results[plugin.label]
        rates = sorted(results[plugin.label + " rates"])
        print(
            f"{plugin.label:28} {cpu * ms:12.3f} {main_ * ms:12.3f} {own * ms:8.3f} "
            f"{rates[len(rates) // 2]:9.0f}"
        )
    print(f"rounds {args.rounds}, {args.cycles} cycles per mode per round; load {os.getloadavg()}")


if __name__ == "__main__":
    main()
