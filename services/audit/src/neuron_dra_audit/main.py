"""``neuron-dra-audit``: settings, wiring, run.

The settings are read before anything else is imported: ``--help`` and a bad setting answer
at once, without loading the bus or the HTTP server.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from neuron_dra_common.runtime import Service

    from neuron_dra_audit.settings import AuditSettings

__all__ = ["build", "main"]

NAME = "audit"
PROG = "neuron-dra-audit"
#: The durable consumer on NEURON_AUDIT (declared in neuron_dra_common.bus.declarations).
CONSUMER = "audit"


async def build(settings: AuditSettings) -> Service:
    """Open the audit file, connect to the bus, run the ``audit`` consumer."""
    import sys
    from pathlib import Path

    from neuron_dra_common.bus import Bus, consumer, credentials_of, inbox_prefix, limits_of
    from neuron_dra_common.runtime import Service
    from neuron_dra_common.runtime.faults import crash_point

    from neuron_dra_audit.auditlog import AuditLog
    from neuron_dra_audit.writer import CRASH_STEPS, CRASH_VARIABLE, AuditWriter

    audit_log = None
    if settings.audit_file:
        audit_log = AuditLog(
            Path(settings.audit_file),
            max_bytes=settings.max_bytes,
            backups=settings.backups,
            fsync=settings.fsync,
            remember=settings.dedupe_lines,
        )
        audit_log.open()
    writer = AuditWriter(
        audit_log=audit_log,
        stdout=sys.stdout.buffer if settings.stdout else None,
        crash=crash_point(CRASH_VARIABLE, CRASH_STEPS),
    )
    bus = await Bus.connect(
        settings.nats_servers,
        name=NAME,
        limits=limits_of(settings),
        credentials=credentials_of(settings),
        inbox=inbox_prefix(NAME),
    )
    spec = consumer(CONSUMER)
    await bus.reconcile(consumers=[spec], replicas=settings.stream_replicas)
    runner = bus.runner(spec, writer.handle)
    service = Service(name=NAME, settings=settings)
    service.add_task("audit", runner.run, stop=runner.stop, ready=lambda: runner.ready)
    service.add_readiness("nats", lambda: bus.connected)
    service.on_shutdown(bus.close)
    if audit_log is not None:

        async def close_log() -> None:
            audit_log.close()

        service.on_shutdown(close_log)
    return service


def main(argv: Sequence[str] | None = None) -> int:
    import sys

    from neuron_dra_common.settings import SettingsError, load

    from neuron_dra_audit.settings import AuditSettings

    try:
        settings = load(AuditSettings, argv=sys.argv[1:] if argv is None else argv, prog=PROG)
    except SettingsError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2

    from neuron_dra_common.runtime.process import run

    async def wire() -> Service:
        return await build(settings)

    return run(wire, name=NAME, settings=settings)
