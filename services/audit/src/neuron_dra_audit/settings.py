"""The audit service's settings; every field also reads ``NEURON_DRA_<FIELD>``
(e.g. ``NEURON_DRA_AUDIT_FILE``)."""

from __future__ import annotations

from typing import Annotated

import msgspec
from neuron_dra_common.settings import ServiceSettings

__all__ = ["AuditSettings"]


class AuditSettings(ServiceSettings, frozen=True, kw_only=True):
    """Writes every event of NEURON_AUDIT as a CloudEvents JSON line to stdout and a file."""

    audit_file: Annotated[
        str,
        msgspec.Meta(
            description="The JSON-lines file, rotated by size (FILE.1 is the newest old one); "
            "empty: stdout only"
        ),
    ] = "/var/log/neuron-dra/audit.jsonl"
    max_bytes: Annotated[
        int, msgspec.Meta(ge=4096, description="Rotate the file before it grows past this")
    ] = 100 * 1024 * 1024
    backups: Annotated[
        int, msgspec.Meta(ge=0, le=1000, description="Rotated files kept (FILE.1 .. FILE.N)")
    ] = 5
    stdout: Annotated[bool, msgspec.Meta(description="Also write each line to stdout")] = True
    fsync: Annotated[
        bool,
        msgspec.Meta(
            description="fsync each batch before acknowledging it (survives a machine crash, "
            "not only a process crash)"
        ),
    ] = False
    dedupe_lines: Annotated[
        int,
        msgspec.Meta(
            ge=0,
            description="On start, event ids read back from the file's last lines: a message "
            "written but not acknowledged before a crash is not written twice",
        ),
    ] = 20_000
