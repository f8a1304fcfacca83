"""Entry point of the ``neuron-dra`` command."""

from __future__ import annotations

import argparse
import sys

from neuron_dra_common.driver import package_version

from neuron_dra_cli.errors import CliError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="neuron-dra",
        description="neuron-dra: Neuron devices on Kubernetes with DRA.",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"neuron-dra {package_version('neuron-dra-cli')}",
        help="print the version and exit",
    )
    sub = parser.add_subparsers(dest="group", metavar="GROUP")
    sub.required = True
    from neuron_dra_cli import dev, events_cmd, topology_cmd

    dev.register(sub)
    events_cmd.register(sub)
    topology_cmd.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = args.handler
    try:
        return int(handler(args) or 0)
    except KeyboardInterrupt:
        return 130
    except CliError as exc:
        print(f"neuron-dra: {exc}", file=sys.stderr)
        return 2
