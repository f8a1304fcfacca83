"""``python -m bench NAME [--quick]``: run one scenario, print its table and a JSON line."""

from __future__ import annotations

import argparse
import importlib
import sys

SCENARIOS = {
    "allocator": "bench.scenarios.allocator",
    "bus": "bench.scenarios.bus",
    "explain": "bench.scenarios.explain",
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
    parser.add_argument(
        "--publisher-replicas",
        type=int,
        choices=(1, 2),
        help="scale only: slice publishers, each writing a share of the nodes (default 1)",
    )
    parser.add_argument(
        "--only",
        choices=["workloads"],
        help="scale only: the fleet and its slices, then only this part",
    )
    parser.add_argument(
        "--failover",
        action="store_true",
        help="scale only: kill -9 the NATS server leading the streams under load",
    )
    parser.add_argument(
        "--chaos",
        action="store_true",
        help="scale only: churn the fleet and run the chaos checks against every node",
    )
    args = parser.parse_args(argv)
    for flag in ("nodes", "failover", "chaos", "publisher_replicas"):
        if getattr(args, flag) and args.name != "scale":
            parser.error(
                f"--{flag.replace('_', '-')}: only the scale scenario takes it, not {args.name}"
            )
    scenario = importlib.import_module(SCENARIOS[args.name])
    if args.only and args.name != "scale":
        parser.error(f"--only: only the scale scenario takes it, not {args.name}")
    extra: dict[str, object] = {"nodes": args.nodes} if args.nodes else {}
    extra |= {flag: True for flag in ("failover", "chaos") if getattr(args, flag)}
    if args.only:
        extra["only"] = args.only
    if args.publisher_replicas:
        extra["publisher_replicas"] = args.publisher_replicas
    report = scenario.run(quick=args.quick, **extra)
    print(report.table())
    print(report.json_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
