"""Starting, watching and stopping the stack's processes.

Every component runs in its own session (process group) so that ``dev down`` can stop it
and everything it spawned, and so that a detached stack outlives the command that started
it. A process is identified by pid *and* start time, so a recycled pid is never killed.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Running:
    """A started process: enough to find it again from another command."""

    pid: int
    start_ticks: int


# Listening ports are chosen below the kernel's ephemeral range. A port the kernel handed
# out for ``bind(0)`` comes from that range, and so does the local end of every outgoing
# connection: between choosing such a port and the component binding it, any of the
# stack's thousands of client connections could take it ("address already in use").
# Below the range, only a process that binds that very port explicitly can.
_LOWEST_PORT = 10_000
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_handed_out: set[int] = set()


def _ephemeral_start() -> int:
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def _bindable(port: int) -> bool:
    """Nothing is bound to ``port``, on loopback or on all addresses."""
    for host in ("127.0.0.1", "0.0.0.0"):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                return False
    return True


def free_port() -> int:
    """A TCP port that nothing is bound to right now, outside the ephemeral range so that
    no outgoing connection can take it before its component binds it, and never the same
    port twice from one process."""
    top = _ephemeral_start()
    if top - _LOWEST_PORT >= 1_000:
        rng = random.SystemRandom()
        for _ in range(200):
            port = rng.randrange(_LOWEST_PORT, top)
            if port not in _handed_out and _bindable(port):
                _handed_out.add(port)
                return port
    # A machine whose ephemeral range leaves no room below it: let the kernel choose.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    _handed_out.add(port)
    return port


def _start_ticks(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses; fields resume after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def start(
    argv: Sequence[str],
    *,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Running:
    """Start ``argv`` in a new session, appending stdout and stderr to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    with open(log_path, "ab") as log:
        log.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(argv)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=cwd,
            start_new_session=True,
        )
    ticks = _start_ticks(proc.pid)
    return Running(pid=proc.pid, start_ticks=ticks if ticks is not None else -1)


def running(pid: int) -> Running:
    """The process ``pid`` as :class:`Running` (its start time read now): one this module
    did not start itself, a forked agent for one."""
    ticks = _start_ticks(pid)
    return Running(pid=pid, start_ticks=ticks if ticks is not None else -1)


def alive(proc: Running) -> bool:
    """True while the very process that was started is still running."""
    _reap(proc.pid)
    ticks = _start_ticks(proc.pid)
    return ticks is not None and ticks == proc.start_ticks


def _reap(pid: int) -> None:
    # Our own children become zombies until waited for; collect them so they read as dead.
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def stop(procs: Sequence[Running], *, timeout: float = 10.0) -> None:
    """SIGTERM each process group, then SIGKILL whatever is left after ``timeout``."""
    live = [p for p in procs if alive(p)]
    for p in live:
        _signal_group(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while live and time.monotonic() < deadline:
        live = [p for p in live if alive(p)]
        if live:
            time.sleep(0.1)
    for p in live:
        _signal_group(p.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while live and time.monotonic() < deadline:
        live = [p for p in live if alive(p)]
        if live:
            time.sleep(0.05)


def kill_group(proc: Running, sig: signal.Signals = signal.SIGKILL) -> None:
    """Send ``sig`` to the process group of ``proc`` if it is still that very process."""
    if alive(proc):
        _signal_group(proc.pid, sig)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        return
    except PermissionError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def tail(path: Path, *, lines: int = 20) -> str:
    """The last ``lines`` lines of a log file (empty if it does not exist)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            data = fh.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


@dataclass(frozen=True)
class Memory:
    """Bytes a process group holds: ``rss`` counts every resident page of each process
    (shared ones too), ``pss`` divides a shared page among the processes that map it, and
    ``uss`` counts only the pages no other process maps (what stopping it would free)."""

    rss: int
    pss: int
    uss: int = 0


def group_memory(pgid: int) -> Memory:
    """Memory of every process in the process group ``pgid``.

    The proportional set size of all components adds up to what the stack really uses (the
    same binary run by many simulated nodes is counted once); the resident set size is what
    each process would take alone.
    """
    rss = pss = uss = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            if int(stat[stat.rindex(")") + 2 :].split()[2]) != pgid:
                continue
            for line in (entry / "smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss += int(line.split()[1]) * 1024
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1]) * 1024
                elif line.startswith(("Private_Clean:", "Private_Dirty:")):
                    uss += int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            continue
    return Memory(rss=rss, pss=pss, uss=uss)
