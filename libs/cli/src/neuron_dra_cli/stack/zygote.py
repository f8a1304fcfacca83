"""The agent zygote: one process imports the agents' code once, and forks every agent.

The local stack runs a discovery agent, a health probe and a kubelet plugin per simulated
node (57 Python processes on the default fleet) beside the cluster services, on a laptop's
few cores. Each would import the same libraries: kubernetes-asyncio's client alone costs
about 3 s of CPU and 65-110 MB, so 57 separate imports on 2 cores would take minutes and
gigabytes. Instead the stack starts this zygote early: it imports the libraries the product
stands on and every service package once, calls ``gc.freeze()`` (the collector then leaves
those objects, and so their memory pages, alone: forked agents share them), and waits on a
control socket. For each agent the stack asks it to fork; the child makes itself a session
of its own (so ``dev down`` and ``dev restart`` signal it like any other component), opens
the agent's own log, takes the agent's environment and argv, and runs the service's own
``python -m`` module with :mod:`runpy`, exactly what a separate ``python -m <module>``
process would run: its ``main`` reads its settings from the environment, builds its event
loop (uvloop), its gRPC servers and its connections, and stops in order on SIGTERM.

Nothing that does not survive a fork exists in the zygote when it forks: no thread (grpcio's
C core runs its own threads, and a fork copies only the calling one), no event loop, and no
open socket but the control socket and the request's connection, which the child closes
first. The zygote checks this before every fork (:func:`fork_hazards`) and refuses to fork
rather than hand an agent a broken copy.

A forked agent's ``/proc/<pid>/cmdline`` and ``/proc/<pid>/environ`` still show the
zygote's (the kernel keeps what a process was exec'd with); ``state.json`` records each
agent's own argv and environment, and ``/proc/<pid>/comm`` (``ps -o comm``, ``top``) its name.
A library that reads a variable when it is imported read the zygote's environment (the
stack's own); the services read their settings in ``main``, after the fork.

This is the local simulation only. On a cluster each agent is the process of its own pod
(a DaemonSet's), started by the image's entry point; nothing here runs there.

The zygote (``python -m neuron_dra_cli.stack.zygote --socket PATH``) answers one JSON line
per connection: ``{"op": "ping"}`` and ``{"op": "spawn", "module": ..., "args": [...],
"env": {...}, "cwd": ..., "log": ..., "name": ...}``, to which it replies ``{"pid": N}``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import os
import pkgutil
import runpy
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, NoReturn

from neuron_dra_cli.stack.bytecode import PACKAGES

__all__ = [
    "DISABLE_ENV",
    "KIND",
    "LIBRARIES",
    "SERVICE_PACKAGES",
    "Spawn",
    "ZygoteError",
    "ask",
    "fork_hazards",
    "main",
    "ping",
    "spawn",
]

#: Component kind of the zygote in ``state.json``.
KIND: Final = "agent-zygote"
#: ``0`` starts every agent as a process of its own (``python -m``), without the zygote.
DISABLE_ENV: Final = "NEURON_DRA_AGENT_ZYGOTE"

#: The libraries the services stand on, imported once before anything is forked.
LIBRARIES: Final = (
    "kubernetes_asyncio.client",
    "kubernetes_asyncio.config",
    "aiohttp",
    "aiohttp.web",
    "grpc",
    "grpc.aio",
    "prometheus_client",
    "uvloop",
    "nats",
    "msgspec",
    "opentelemetry.sdk.trace",
)
#: Every package the stack runs as a service: each of their modules is imported once.
SERVICE_PACKAGES: Final = PACKAGES
#: The longest a request may be (an agent's environment is a few KiB).
_MAX_REQUEST: Final = 1 << 20
_PEERCRED: Final = struct.Struct("3i")


class ZygoteError(RuntimeError):
    """The zygote cannot be reached, or refused to fork."""


@dataclass(frozen=True)
class Spawn:
    """What a forked child becomes: ``python -m module *args`` with ``env`` in ``cwd``,
    stdout and stderr appended to ``log``."""

    module: str
    args: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    log: str
    name: str


# --- the stack's side ------------------------------------------------------------------


def ask(sock_path: Path, request: Mapping[str, object], *, timeout: float) -> dict[str, object]:
    """Send one request to the zygote; its JSON reply (``{"error": ...}`` when refused)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            conn.connect(str(sock_path))
            conn.sendall(json.dumps(request).encode() + b"\n")
            conn.shutdown(socket.SHUT_WR)
            data = b""
            while chunk := conn.recv(65536):
                data += chunk
    except OSError as exc:
        raise ZygoteError(f"the agent zygote at {sock_path} cannot be reached: {exc}") from None
    try:
        reply = json.loads(data)
    except ValueError:
        raise ZygoteError(f"the agent zygote at {sock_path} answered {data[:200]!r}") from None
    if not isinstance(reply, dict):
        raise ZygoteError(f"the agent zygote at {sock_path} answered {reply!r}")
    return reply


def ping(sock_path: Path, *, timeout: float = 0.5) -> bool:
    """True once the zygote has imported everything and takes requests."""
    try:
        return ask(sock_path, {"op": "ping"}, timeout=timeout).get("ok") is True
    except ZygoteError:
        return False


def spawn(
    sock_path: Path,
    *,
    module: str,
    args: Sequence[str] = (),
    env: Mapping[str, str],
    log: Path,
    name: str,
    cwd: Path | None = None,
    timeout: float = 30.0,
) -> int:
    """Have the zygote fork ``python -m module *args`` with exactly ``env``; its pid.

    >>> spawn(layout.zygote_socket, module="neuron_dra_discovery", env=env,
    ...       log=layout.log("discovery-trn2-48xl-0"), name="discovery-trn2-48xl-0")
    41327
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    reply = ask(
        sock_path,
        {
            "op": "spawn",
            "module": module,
            "args": list(args),
            "env": dict(env),
            "cwd": str(cwd or Path.cwd()),
            "log": str(log),
            "name": name,
        },
        timeout=timeout,
    )
    pid = reply.get("pid")
    if not isinstance(pid, int):
        raise ZygoteError(f"the agent zygote did not start {name}: {reply.get('error', reply)}")
    return pid


# --- the zygote's side ------------------------------------------------------------------


def fork_hazards(*, keep_fds: Collection[int] = ()) -> list[str]:
    """What would not survive a fork in this process, said plainly (empty: safe to fork).

    More than one thread (a fork copies only the calling one: grpcio's or any other's would
    be gone, holding their locks), a running event loop, or an open socket other than
    ``keep_fds`` (the child would share it with its parent).
    """
    found = []
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1 or threading.active_count() != 1:
        names = ", ".join(t.name for t in threading.enumerate())
        found.append(f"{threads} threads run (Python's: {names})")
    import asyncio

    with contextlib.suppress(RuntimeError):
        asyncio.get_running_loop()
        found.append("an event loop is running")
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:") and int(fd) not in keep_fds:
                found.append(f"file descriptor {fd} is an open socket")
    return found


def preload(libraries: Sequence[str], packages: Sequence[str]) -> list[str]:
    """Import ``libraries`` and every module of ``packages`` (not their ``__main__``);
    return what could not be imported (a forked agent imports it itself, as it would)."""
    failed = []
    for name in libraries:
        try:
            importlib.import_module(name)
        except Exception as exc:  # any import error only costs the agents time
            failed.append(f"{name}: {exc!r}")
    for top in packages:
        try:
            package = importlib.import_module(top)
        except Exception as exc:
            failed.append(f"{top}: {exc!r}")
            continue
        for info in pkgutil.walk_packages(package.__path__, top + "."):
            if info.name.rsplit(".", 1)[-1] == "__main__":
                continue
            try:
                importlib.import_module(info.name)
            except Exception as exc:
                failed.append(f"{info.name}: {exc!r}")
    return failed


def _peer_allowed(conn: socket.socket) -> bool:
    """Only this user (or root) may have the zygote fork: the socket's mode says so too."""
    _, uid, _ = _PEERCRED.unpack(
        conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    )
    return uid in (0, os.getuid())


def _read_request(conn: socket.socket) -> dict[str, object]:
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
        if len(data) > _MAX_REQUEST:
            raise ValueError(f"request longer than {_MAX_REQUEST} bytes")
    request = json.loads(data)
    if not isinstance(request, dict):
        raise ValueError(f"request is not a JSON object: {data[:100]!r}")
    return request


def _spawn_of(request: Mapping[str, object]) -> Spawn:
    module, args, env = request.get("module"), request.get("args"), request.get("env")
    cwd, log, name = request.get("cwd"), request.get("log"), request.get("name")
    if not (isinstance(module, str) and module):
        raise ValueError("spawn: 'module' must be a module name")
    if not (isinstance(args, list) and all(isinstance(a, str) for a in args)):
        raise ValueError("spawn: 'args' must be a list of strings")
    if not (isinstance(env, dict) and all(isinstance(v, str) for v in env.values())):
        raise ValueError("spawn: 'env' must map names to strings")
    if not (isinstance(cwd, str) and isinstance(log, str) and isinstance(name, str)):
        raise ValueError("spawn: 'cwd', 'log' and 'name' must be strings")
    return Spawn(
        module=module,
        args=tuple(args),
        env={str(k): v for k, v in env.items()},
        cwd=cwd,
        log=log,
        name=name,
    )


def _now() -> str:
    """The time to the millisecond, as the services' logs write it."""
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"


def _say(message: str) -> None:
    # Straight to the file descriptor: the SIGCHLD handler says things too, and a buffered
    # stream entered again from a signal handler raises.
    line = f"{_now()} agent-zygote: {message}\n"
    with contextlib.suppress(OSError):
        os.write(2, line.encode())


def _reap(signum: int, frame: object) -> None:
    """Collect every child that exited, so none lingers as a zombie."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _say(f"pid {pid} exited ({_exit_of(status)})")


def _exit_of(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"signal {signal.Signals(os.WTERMSIG(status)).name}"
    return f"code {os.waitstatus_to_exitcode(status)}"


def _serve(listener: socket.socket) -> Spawn:
    """Answer requests until one forks: return, in the child, what it is to become (the
    parent loops here until it is stopped)."""
    while True:
        conn, _ = listener.accept()
        try:
            conn.settimeout(10.0)
            if not _peer_allowed(conn):
                conn.sendall(b'{"error": "not allowed"}')
                continue
            request = _read_request(conn)
            if request.get("op") == "ping":
                conn.sendall(json.dumps({"ok": True, "pid": os.getpid()}).encode())
                continue
            if request.get("op") != "spawn":
                raise ValueError(f"unknown op {request.get('op')!r}")
            what = _spawn_of(request)
            hazards = fork_hazards(keep_fds=(listener.fileno(), conn.fileno()))
            if hazards:
                raise ValueError("refusing to fork: " + "; ".join(hazards))
            # What the children share stays out of the collector's reach (and its writes).
            gc.freeze()
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                listener.close()
                conn.close()
                return what
            _say(f"forked {what.name} (python -m {what.module}) as pid {pid}")
            try:
                conn.sendall(json.dumps({"pid": pid}).encode())
            except OSError as exc:
                # Whoever asked gave up waiting and starts it some other way: no second copy
                # of the agent may run unrecorded.
                _say(f"{what.name} (pid {pid}) killed: its pid could not be handed back: {exc}")
                os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError) as exc:
            _say(f"request refused: {exc}")
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"error": str(exc)}).encode())
        finally:
            conn.close()


def _become(what: Spawn) -> NoReturn:
    """In the forked child: turn into ``python -m what.module`` and run it to its end."""
    # A session of its own, as the stack starts every component: `dev down` signals it.
    os.setsid()
    for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    gc.enable()
    fd = os.open(what.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    header = f"--- {_now()} python -m {what.module} (forked)"
    os.write(fd, (" ".join((header, *what.args)) + "\n").encode())
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    with contextlib.suppress(OSError):
        Path("/proc/self/comm").write_text(what.name[:15])
    os.chdir(what.cwd)
    os.environ.clear()
    os.environ.update(what.env)
    sys.argv = [what.module, *what.args]
    module = sys.modules.get(what.module)
    if module is not None and not hasattr(module, "__path__"):
        # Run as __main__ afresh, as `python -m` does (and without runpy's warning that
        # the module was imported already).
        del sys.modules[what.module]
    runpy.run_module(what.module, run_name="__main__", alter_sys=True)
    raise SystemExit(0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m neuron_dra_cli.stack.zygote",
        description="The local stack's agent zygote: imports the services once, then forks "
        "each agent on request (local simulation only).",
    )
    parser.add_argument("--socket", required=True, help="control socket to listen on")
    args = parser.parse_args(argv)
    sock_path = Path(args.socket)
    # Objects made while importing are never collected before a fork: no freed holes in
    # the shared pages, and no collection that writes into all of them (gc.freeze's advice).
    gc.disable()
    t0 = time.process_time()
    failed = preload(LIBRARIES, SERVICE_PACKAGES)
    for item in failed:
        _say(f"not preloaded (the agents import it themselves): {item}")
    gc.freeze()
    _say(
        f"{len(sys.modules)} modules imported in {time.process_time() - t0:.1f} s of CPU; "
        f"{gc.get_freeze_count()} objects frozen"
    )
    me = os.getpid()
    stopped = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopped
        if os.getpid() != me:
            # A child stopped before it could take the default action back: stop as that
            # would have.
            os._exit(128 + signum)
        stopped = True
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGCHLD, _reap)
    sock_path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        listener.bind(str(sock_path))
    finally:
        os.umask(old_umask)
    listener.listen(64)
    try:
        what = _serve(listener)
    except SystemExit:
        if os.getpid() != me:
            raise
        listener.close()
        sock_path.unlink(missing_ok=True)
        _say("stopped" if stopped else "exiting")
        return 0
    _become(what)


if __name__ == "__main__":
    raise SystemExit(main())
