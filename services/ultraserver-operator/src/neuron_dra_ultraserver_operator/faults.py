"""Crash points for testing crash safety: stop the process dead between two writes.

The steps of the UltraServer operator, picked with ``NEURON_DRA_OPERATOR_CRASH_AT`` (see
``neuron_dra_common.runtime.faults``); killed there, it hands no Lease back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from neuron_dra_common.runtime.faults import CrashPoint, crash_point, no_crash

__all__ = ["CRASH_ENV", "STEPS", "CrashPoint", "from_env", "no_crash"]

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
    "delete:cleared",  # status.allocations emptied; the allocator still holds the nodes
    "delete:released",  # the allocator released the nodes; the finalizer still holds
)


def from_env(environ: Mapping[str, str] | None = None) -> CrashPoint:
    """The crash point the environment asks for; raises ``ValueError`` for an unknown step."""
    return crash_point(CRASH_ENV, STEPS, environ)
