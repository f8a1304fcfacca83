"""Crash points for testing crash safety: stop the process dead at a named step.

A service names its steps and the environment variable that picks one; :func:`crash_point`
returns a function the service calls at each step. Unless the variable names a step it does
nothing. At the chosen step the process kills itself with SIGKILL, like ``kill -9`` or the
OOM killer: no cleanup, no flushed buffers, nothing that a graceful exit would do.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Mapping, Sequence

__all__ = ["CrashPoint", "crash_point", "no_crash"]

log = logging.getLogger(__name__)

CrashPoint = Callable[[str], None]


def no_crash(step: str) -> None:
    """The crash point of a normal run."""


def _kill(step: str) -> None:
    log.critical("crash point reached, killing the process", extra={"step": step})
    os.kill(os.getpid(), signal.SIGKILL)


def crash_point(
    variable: str, steps: Sequence[str], environ: Mapping[str, str] | None = None
) -> CrashPoint:
    """The crash point ``variable`` asks for; ``ValueError`` when it names no step."""
    wanted = (os.environ if environ is None else environ).get(variable, "")
    if not wanted:
        return no_crash
    if wanted not in steps:
        raise ValueError(f"{variable}={wanted!r}: expected one of {', '.join(steps)}")

    def crash_at(step: str) -> None:
        if step == wanted:
            _kill(step)

    return crash_at
