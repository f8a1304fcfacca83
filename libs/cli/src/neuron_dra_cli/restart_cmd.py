"""``neuron-dra dev restart``: stop one component of the local stack and start it again.

What a platform engineer sees when NATS, the apiserver or one service is restarted (an
upgrade, a crash, an OOM kill): the component goes away, with SIGTERM or ``--kill``
(SIGKILL, no goodbye), stays away ``--down`` seconds, and comes back with the same command
line, environment, ports and data directory, so whoever talks to it must reconnect.

A process that exits while starting is started again until ``--timeout``, as the kubelet
restarts a control-plane static pod: a kube-apiserver whose storage answers too slowly exits
from a post-start hook and comes up at the next try. The apiserver counts as back once its
``/readyz`` answers (its port opens well before it can serve), every other component once
its ports accept connections.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from neuron_dra_cli import paths
from neuron_dra_cli.errors import CliError
from neuron_dra_cli.stack import probes, process, state, zygote
from neuron_dra_cli.stack.layout import Layout

__all__ = ["Restarted", "register", "restart_component"]

#: The pause before the second start of a component that exited while starting; it doubles
#: with each start after that, up to 5 s.
_BACKOFF_SECONDS = 0.2


class Restarted(msgspec.Struct, frozen=True, kw_only=True):
    """One restart: the new process and how long the component was away."""

    name: str
    old_pid: int
    pid: int
    #: From the stop signal to the new process being ready.
    away_seconds: float
    #: From the first new start to being ready.
    ready_seconds: float
    #: Unix time at which it was back.
    back_at: float
    #: How many times it was started (more than 1 when it exited while starting).
    starts: int = 1


def register(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = verbs.add_parser(
        "restart",
        help="stop one component of the stack and start it again (NATS, the apiserver, ...)",
        description="Stop a component of the local stack (SIGTERM, or SIGKILL with --kill), "
        "keep it down --down seconds, and start it again with the command line, environment, "
        "ports and data it had; returns once it is ready again (the apiserver: /readyz; "
        "others: their ports accept connections), starting it again if it exits meanwhile. "
        "Names are those "
        "of `neuron-dra dev status` (for example nats, kube-apiserver, etcd, "
        "slice-publisher-0). A component the stack did not start itself (one started by a "
        "test) cannot be restarted here.",
    )
    p.add_argument("name", metavar="COMPONENT")
    p.add_argument("--kill", action="store_true", help="SIGKILL instead of SIGTERM")
    p.add_argument(
        "--down",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="seconds to stay down before starting again (default 0)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=90.0,
        metavar="SECONDS",
        help="how long it may take to be ready again, restarts included (default 90)",
    )
    paths.add_state_dir_option(p)
    p.set_defaults(handler=cmd_restart)


def cmd_restart(args: argparse.Namespace) -> int:
    if args.down < 0:
        raise CliError(f"--down {args.down}: want 0 or more seconds")
    if args.timeout <= 0:
        raise CliError(f"--timeout {args.timeout}: want a positive number of seconds")
    state_dir = (
        Path(args.state_dir).expanduser().resolve() if args.state_dir else paths.default_state_dir()
    )
    done = restart_component(
        state_dir, name=args.name, kill=args.kill, down_seconds=args.down, timeout=args.timeout
    )
    print(
        f"{done.name}: pid {done.old_pid} stopped ({'SIGKILL' if args.kill else 'SIGTERM'}), "
        f"pid {done.pid} ready {done.ready_seconds:.1f} s after its start"
        + (f" ({done.starts} starts: it exited while starting)" if done.starts > 1 else "")
        + f", {done.away_seconds:.1f} s away in all"
    )
    return 0


def restart_component(
    state_dir: Path,
    *,
    name: str,
    kill: bool = False,
    down_seconds: float = 0.0,
    timeout: float = 90.0,
) -> Restarted:
    """Stop ``name`` of the stack under ``state_dir`` and start it again the same way.

    >>> restart_component(state_dir, name="nats", kill=True, down_seconds=2).away_seconds
    2.4
    """
    current = state.load(state_dir)
    if current is None:
        raise CliError(f"no stack recorded under {state_dir}; start one with `neuron-dra dev up`")
    entry = next((c for c in current.components if c.name == name), None)
    if entry is None:
        known = ", ".join(sorted(c.name for c in current.components))
        raise CliError(f"no component {name!r} in the stack under {state_dir}; it has: {known}")
    if not entry.argv:
        raise CliError(
            f"{name} was not started by `neuron-dra dev up` (no command line recorded for it in "
            f"{state.state_file(state_dir)}); restart it the way it was started"
        )
    old = process.Running(pid=entry.pid, start_ticks=entry.start_ticks)
    stopped = time.monotonic()
    if kill:
        process.kill_group(old, signal.SIGKILL)
    process.stop([old], timeout=15.0)
    if process.alive(old):
        raise CliError(f"{name} (pid {entry.pid}) did not stop")
    time.sleep(down_seconds)

    log = Path(entry.log)
    started = time.monotonic()
    ready = _readiness(state_dir, entry)
    starts = 0
    running: process.Running | None = None
    while running is None or not ready():
        if running is None or not process.alive(running):
            if running is not None:
                print(
                    f"{name} exited while starting; last lines of {log}:\n" + process.tail(log),
                    file=sys.stderr,
                )
                # Backing off as the kubelet does for a container that keeps exiting.
                time.sleep(min(_BACKOFF_SECONDS * 2 ** (starts - 1), 5.0))
            if time.monotonic() - started > timeout:
                raise CliError(
                    f"{name} kept exiting while starting for {timeout:.0f} s ({starts} starts)"
                )
            running, forked = _start(state_dir, entry, log=log)
            starts += 1
            # Recorded at once, so `dev down` stops the new process even if this command
            # dies now.
            fresh = msgspec.structs.replace(
                entry,
                pid=running.pid,
                start_ticks=running.start_ticks,
                started_at=time.time(),
                ready_seconds=None,
                forked=forked,
            )
            _record(state_dir, fresh)
        elif time.monotonic() - started > timeout:
            raise CliError(
                f"{name} was not ready {timeout:.0f} s after its start; last lines "
                f"of {log}:\n" + process.tail(log, lines=15)
            )
        time.sleep(0.05)
    back = time.monotonic()
    _record(state_dir, msgspec.structs.replace(fresh, ready_seconds=back - started))
    return Restarted(
        name=name,
        old_pid=entry.pid,
        pid=running.pid,
        away_seconds=back - stopped,
        ready_seconds=back - started,
        back_at=time.time(),
        starts=starts,
    )


def _start(
    state_dir: Path, entry: state.ComponentState, *, log: Path
) -> tuple[process.Running, bool]:
    """Start ``entry`` again as it was started: forked by the agent zygote while it runs (a
    service ``dev up`` forked), else with its command line; whether it was forked."""
    if entry.forked and len(entry.argv) >= 3:
        with contextlib.suppress(zygote.ZygoteError):
            pid = zygote.spawn(
                Layout(state_dir).zygote_socket,
                module=entry.argv[2],
                args=entry.argv[3:],
                env={**os.environ, **entry.env},
                log=log,
                name=entry.name,
            )
            return process.running(pid), True
    return process.start(entry.argv, log_path=log, env=entry.env), False


def _readiness(state_dir: Path, entry: state.ComponentState) -> Callable[[], bool]:
    """When ``entry`` counts as back: the apiserver answering /readyz to the stack's admin,
    anything else accepting connections on all its ports."""

    def ports_open() -> bool:
        return all(probes.tcp_open(port) for port in entry.ports.values())

    if entry.kind != "kube-apiserver":
        return ports_open
    pki = Layout(state_dir).pki
    url = f"https://127.0.0.1:{entry.ports['https']}/readyz"

    def answers() -> bool:
        return ports_open() and probes.https_ok(
            url, ca=pki / "ca.crt", cert=pki / "admin.crt", key=pki / "admin.key"
        )

    return answers


def _record(state_dir: Path, entry: state.ComponentState) -> None:
    """Put ``entry`` in place of the component of its name, reading the state afresh (other
    commands may have recorded components meanwhile)."""
    current = state.load(state_dir)
    if current is None:
        raise CliError(f"the stack under {state_dir} was stopped meanwhile")
    components = tuple(entry if c.name == entry.name else c for c in current.components)
    state.save(state_dir, msgspec.structs.replace(current, components=components))
