"""Runs an exec credential plugin and kills it, with everything it started, at a deadline.

kubernetes-asyncio's ``ExecProvider`` starts the plugin with ``asyncio.create_subprocess_exec``
and keeps no handle a caller could reach: cancelling the task that awaits it leaves the
plugin running (with the asyncio loop and with uvloop alike), and a plugin that never exits
would hold its pipes, and the token refresh, for ever. The kubeconfig loader therefore runs
the plugin's command through this file (``python -I execguard.py SECONDS -- COMMAND ARGS``):
the plugin inherits stdin, stdout, stderr and the environment the library prepared, so the
library reads its ExecCredential as if it had started it itself; at the deadline the guard
kills the plugin's whole process group and exits 124, which the library reports as a failed
plugin. Standard library only: it starts in a few milliseconds with ``-I``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from types import FrameType

__all__ = ["TIMED_OUT", "argv"]

#: The guard's exit code when it killed the plugin (coreutils ``timeout`` uses the same).
TIMED_OUT = 124


def argv(timeout: float) -> list[str]:
    """The arguments, after the Python interpreter, that run a command under the guard."""
    return ["-I", os.path.abspath(__file__), f"{timeout:g}", "--"]


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def main(args: list[str]) -> int:
    if len(args) < 3 or args[1] != "--":
        print("usage: execguard.py SECONDS -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    seconds, command = float(args[0]), args[2:]
    try:
        # Its own session: the group is the plugin and whatever it starts.
        child = subprocess.Popen(command, start_new_session=True)
    except OSError as exc:
        print(
            f"exec credential plugin {command[0]}: cannot be run: {exc.strerror}", file=sys.stderr
        )
        return 127

    def stop(signum: int, frame: FrameType | None) -> None:
        _kill_group(child.pid)
        child.wait()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        return child.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        _kill_group(child.pid)
        child.wait()
        print(
            f"exec credential plugin {command[0]}: no answer in {seconds:g} s; killed",
            file=sys.stderr,
        )
        return TIMED_OUT


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
