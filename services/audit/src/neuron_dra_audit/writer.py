"""The audit consumer's handler: each event as one CloudEvents line, file first, then stdout.

The runner acknowledges a message only after :meth:`AuditWriter.handle` returned, that is
after its line is in the file (and flushed to stdout), so nothing acknowledged is missing.
"""

from __future__ import annotations

from typing import BinaryIO

from neuron_dra_common.bus import Delivery, encode_line, structured
from neuron_dra_common.events import AnyEvent, encode
from neuron_dra_common.runtime.faults import CrashPoint, no_crash
from neuron_dra_common.telemetry import Counter, Gauge

from neuron_dra_audit.auditlog import AuditLog

__all__ = ["CRASH_STEPS", "CRASH_VARIABLE", "AuditWriter"]

#: For crash tests: ``NEURON_DRA_AUDIT_CRASH_AT=after-write`` kills the process (SIGKILL)
#: once the first line is written and before its message is acknowledged.
CRASH_VARIABLE = "NEURON_DRA_AUDIT_CRASH_AT"
CRASH_STEPS = ("after-write",)

WRITTEN = Counter(
    "neuron_dra_audit_events_written",
    "Events written as CloudEvents lines, by event type",
    ["type"],
)
DUPLICATES = Counter(
    "neuron_dra_audit_duplicates_skipped",
    "Events delivered again that were already in the audit file (written, ack lost)",
)
ROTATIONS = Counter("neuron_dra_audit_file_rotations", "Times the audit file was rotated")
FILE_BYTES = Gauge("neuron_dra_audit_file_bytes", "Size of the current audit file")


class AuditWriter:
    """Writes each delivered event to the audit file (if any) and to ``stdout`` (if any)."""

    def __init__(
        self,
        *,
        audit_log: AuditLog | None,
        stdout: BinaryIO | None,
        crash: CrashPoint = no_crash,
    ) -> None:
        self._crash = crash
        self._log = audit_log
        self._stdout = stdout
        self._rotations = 0

    async def handle(self, event: AnyEvent, delivery: Delivery) -> None:
        ce = structured(
            event,
            payload=delivery.payload or encode(event),
            headers=delivery.headers,
            fallback_id=f"{delivery.stream}:{delivery.stream_sequence}",
        )
        audit_log = self._log
        if audit_log is not None and audit_log.written(ce.id):
            DUPLICATES.inc()
            return
        line = encode_line(ce)
        if audit_log is not None:
            audit_log.write(ce.id, line)
            if audit_log.rotations != self._rotations:
                ROTATIONS.inc(audit_log.rotations - self._rotations)
                self._rotations = audit_log.rotations
            FILE_BYTES.set(audit_log.size)
        if self._stdout is not None:
            self._stdout.write(line)
            self._stdout.flush()
        WRITTEN.labels(event.event_type()).inc()
        self._crash("after-write")
