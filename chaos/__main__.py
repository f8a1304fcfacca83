"""``python -m chaos``: churn and faults against a running local stack, invariants checked
all along, then a wait for convergence; a table and one JSON line. Exit status 0 when no
invariant broke, the stack converged and every server's return was followed by all up within
goal R2's bound, 1 otherwise (the seed to replay is printed)."""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

from neuron_dra_cli import paths
from neuron_dra_cli.errors import CliError

from chaos.driver import Options, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m chaos",
        description=__doc__,
        epilog="The stack needs trn2.48xlarge nodes for the pods and trn2u.48xlarge "
        "UltraServers for the workloads (tests/fleets/chaos.yaml has both): "
        "neuron-dra dev up --fleet tests/fleets/chaos.yaml, then python -m chaos.",
    )
    parser.add_argument("--minutes", type=float, default=5.0, help="how long to churn (default 5)")
    parser.add_argument(
        "--seed", type=int, default=None, help="random seed (default: a new one, printed)"
    )
    parser.add_argument(
        "--no-servers",
        action="store_true",
        help="never restart NATS or the apiserver (only neuron-dra processes are killed)",
    )
    parser.add_argument(
        "--restart-first",
        choices=("nats", "kube-apiserver"),
        default=None,
        help="restart this server as the churn's first step (goal R2 is then always measured)",
    )
    parser.add_argument(
        "--converge-seconds",
        type=float,
        default=240.0,
        help="how long the stack may take to converge once the churn is over (default 240)",
    )
    parser.add_argument(
        "--fuzz",
        type=int,
        default=0,
        metavar="N",
        help="once converged, send N malformed messages to the stack's durable consumers and "
        "check each becomes one dead letter of each, with no process dying (goal R3: 10000)",
    )
    parser.add_argument(
        "--rollout",
        action="store_true",
        help="once converged, roll a trn2 node's kubelet plugin once per prepare and unprepare "
        "step, the new plugin dying at that step, and check the old one finishes its work "
        "(goal R4)",
    )
    parser.add_argument(
        "--state-dir",
        default=None,
        help=f"the stack's state directory (env {paths.STATE_DIR_ENV})",
    )
    args = parser.parse_args(argv)
    if args.minutes <= 0:
        parser.error(f"--minutes {args.minutes}: want a positive number")
    if args.converge_seconds <= 0:
        parser.error(f"--converge-seconds {args.converge_seconds}: want a positive number")
    if args.fuzz < 0:
        parser.error(f"--fuzz {args.fuzz}: want 0 or more")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    state_dir = (
        Path(args.state_dir).expanduser().resolve() if args.state_dir else paths.default_state_dir()
    )
    print(f"chaos: seed {seed}, {args.minutes:g} minutes against the stack in {state_dir}")
    try:
        outcome = run(
            Options(
                state_dir=state_dir,
                seconds=args.minutes * 60,
                seed=seed,
                servers=not args.no_servers,
                restart_first=args.restart_first,
                converge_within=args.converge_seconds,
                fuzz=args.fuzz,
                rollout=args.rollout,
                say=lambda line: print(line, flush=True),
            )
        )
    except CliError as exc:
        print(f"chaos: {exc}", file=sys.stderr)
        return 2
    print(outcome.table())
    print(outcome.json_line())
    if not outcome.ok:
        print(
            f"replay: python -m chaos --seed {seed} --minutes {args.minutes:g}"
            + (" --no-servers" if args.no_servers else "")
            + (f" --restart-first {args.restart_first}" if args.restart_first else "")
            + (f" --fuzz {args.fuzz}" if args.fuzz else "")
            + (" --rollout" if args.rollout else ""),
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
