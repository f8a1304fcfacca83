"""Crash points for testing crash safety: stop the process dead between two writes.

Only honoured when ``NEURON_DRA_OPERATOR_CRASH_AT`` is set (to one of :data:`STEPS`); in
every other case :func:`from_env` returns a function that does nothing. The process kills
itself with SIGKILL, like ``kill -9`` or the OOM killer: no cleanup, no Lease handed back.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Mapping
from typing import Final

__all__ = ["CRASH_ENV", "STEPS", "CrashPoint", "from_env", "no_crash"]

log = logging.getLogger(__name__)

CRASH_ENV: Final = "NEURON_DRA_OPERATOR_CRASH_AT"

#: The writes of a workload's allocation and of its deletion, in the order they happen
#: (see ``workloads``). A node step fires after the first node of the gang was written.
STEPS: Final = (
    "allocate:granted",  # the allocator granted; nothing recorded in the workload yet
    "allocate:recorded",  # status.allocations written (Allocating)
    "allocate:node-pending",  # a node record written, phase Pending
    "allocate:node-bound",  # a node record written, phase Bound (its devices get tagged)
    "allocate:template",  # the ResourceClaimTemplate applied
    "allocate:allocated",  # state Allocated written
    "delete:deallocating",  # state Deallocating written
    "delete:template-deleted",  # the ResourceClaimTemplate deleted
    "delete:node-cleared",  # a node record removed (its devices get untagged)
    "delete:released",  # the allocator released the nodes; the finalizer still holds
)

CrashPoint = Callable[[str], None]


def no_crash(step: str) -> None:
    """The crash point of a normal run."""


def _kill(step: str) -> None:
    log.critical("crash point reached, killing the process", extra={"step": step})
    os.kill(os.getpid(), signal.SIGKILL)


def from_env(environ: Mapping[str, str] | None = None) -> CrashPoint:
    """The crash point the environment asks for; raises ``ValueError`` for an unknown step."""
    wanted = (os.environ if environ is None else environ).get(CRASH_ENV, "")
    if not wanted:
        return no_crash
    if wanted not in STEPS:
        raise ValueError(f"{CRASH_ENV}={wanted!r}: expected one of {', '.join(STEPS)}")

    def crash_at(step: str) -> None:
        if step == wanted:
            _kill(step)

    return crash_at
