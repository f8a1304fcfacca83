"""Crash points for testing crash safety: stop the process dead at a named step.

The steps of the kubelet plugin, picked with ``NEURON_DRA_PLUGIN_CRASH_AT`` (see
``neuron_dra_common.runtime.faults``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from neuron_dra_common.runtime.faults import CrashPoint, crash_point, no_crash

__all__ = ["CRASH_ENV", "STEPS", "CrashPoint", "from_env", "no_crash"]

CRASH_ENV: Final = "NEURON_DRA_PLUGIN_CRASH_AT"

#: The steps of prepare and unprepare, in the order they run (see ``preparer``).
STEPS: Final = (
    "prepare:claim-read",
    "prepare:started-saved",
    "prepare:spec-written",
    "prepare:completed-saved",
    "unprepare:begin",
    "unprepare:spec-removed",
    "unprepare:entry-dropped",
)


def from_env(environ: Mapping[str, str] | None = None) -> CrashPoint:
    """The crash point the environment asks for; raises ``ValueError`` for an unknown step."""
    return crash_point(CRASH_ENV, STEPS, environ)
