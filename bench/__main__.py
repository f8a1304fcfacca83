"""``python -m bench NAME [--quick]``: run one scenario, print its table and a JSON line."""

from __future__ import annotations

import argparse
import importlib
import sys

SCENARIOS = {
    "allocator": "bench.scenarios.allocator",
    "bus": "bench.scenarios.bus",
    "extender": "bench.scenarios.extender",
    "heartbeats": "bench.scenarios.heartbeats",
    "prepare": "bench.scenarios.prepare",
    "recovery": "bench.scenarios.recovery",
    "scale": "bench.scenarios.scale",
    "slices": "bench.scenarios.slices",
    "ultraserver": "bench.scenarios.ultraserver",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("name", choices=sorted(SCENARIOS), help="scenario to run")
    parser.add_argument("--quick", action="store_true", help="smaller run, under a minute")
    parser.add_argument(
        "--nodes",
        type=int,
        nargs="+",
        action="extend",
        metavar="N",
        help="scale only: the fleet sizes to run, one after the other",
    )
    args = parser.parse_args(argv)
    if args.nodes and args.name != "scale":
        parser.error(f"--nodes: only the scale scenario takes it, not {args.name}")
    scenario = importlib.import_module(SCENARIOS[args.name])
    extra = {"nodes": args.nodes} if args.nodes else {}
    report = scenario.run(quick=args.quick, **extra)
    print(report.table())
    print(report.json_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
