"""Entry point of the ``neuron-dra`` command."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import sys

from neuron_dra_common.driver import package_version

from neuron_dra_cli.errors import CliError


def build_parser(prog: str = "neuron-dra") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
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
    from neuron_dra_cli import events_cmd, explain_cmd, topology_cmd

    missing = missing_dev_extra()
    if missing:
        _register_dev_unavailable(sub, missing)
    else:
        from neuron_dra_cli import dev

        dev.register(sub)
    events_cmd.register(sub)
    explain_cmd.register(sub)
    topology_cmd.register(sub)
    return parser


def missing_dev_extra() -> list[str]:
    """The distributions of the CLI's ``dev`` extra (what only the local stack uses: its PKI,
    NATS server, kubectl) that are not installed; the container image has none of them."""
    missing = []
    for requirement in importlib.metadata.requires("neuron-dra-cli") or []:
        if not re.search(r"extra\s*==\s*[\"']dev[\"']", requirement):
            continue
        name = re.split(r"[\s=<>!~;\[]", requirement, maxsplit=1)[0]
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
    return missing


def _register_dev_unavailable(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], missing: list[str]
) -> None:
    dev = sub.add_parser(
        "dev",
        help="the local stack (not installed here: needs the `dev` extra)",
        add_help=False,
    )
    dev.add_argument("rest", nargs=argparse.REMAINDER)

    def unavailable(args: argparse.Namespace) -> int:
        raise CliError(
            "`neuron-dra dev` runs the local stack and needs what the CLI's `dev` extra "
            f"installs ({', '.join(missing)} missing here; the container image leaves them "
            "out). In a checkout, `make up` installs it; elsewhere "
            "`pip install 'neuron-dra-cli[dev]'`."
        )

    dev.set_defaults(handler=unavailable)


def main(argv: list[str] | None = None, *, prog: str = "neuron-dra") -> int:
    line_buffered_stdout()
    try:
        parser = build_parser(prog)
        args = parser.parse_args(argv)
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        return 130
    except CliError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`| head`): nothing more can be shown; stop quietly. Whatever
        # is still buffered for stdout goes nowhere instead of failing again at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # what a shell reports for a process ended by SIGPIPE


def line_buffered_stdout() -> None:
    """Write stdout a line at a time, also into a pipe or a file.

    Python buffers a redirected stdout in blocks, so a ``dev up`` whose output goes to a log
    (CI, a supervisor, ``| tee``) would print nothing of its ready summary until it exits;
    a reader waiting for that summary would wait for ever.
    """
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:
        reconfigure(line_buffering=True)
