"""Which preparation of each claim the plugin last told about, so every one has its own id.

A claim's events carry a CloudEvents id that the bus (its duplicate window) and every
consumer (the audit among them) take as "the same event" when it comes again. A
ResourceClaim can be prepared on a node, unprepared, and prepared again (a standalone claim
used by one pod after another), and each of those is a new event: so the id names the
preparation, its *generation* on this node since the node booted. A change told again (the
kubelet's retry after a process died between the disk and the bus) keeps its generation and
so its id.

The ledger is a small file beside the checkpoint (``told.json``), which the checkpoint's
format and the previous release know nothing of. It is written (to a temporary file,
renamed) before the event is queued, and read again before each change, so the two
processes of a rolling update share it. Losing it costs no claim state, only the guarantee
that a re-preparation of a claim is not taken for one told already.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Final, Literal

import msgspec

__all__ = ["KEEP_UNPREPARED", "ToldLedger"]

log = logging.getLogger(__name__)

#: How many claims told unprepared the ledger keeps (the oldest are forgotten first): a claim
#: prepared again after this many others came and went on the node starts over at 1.
KEEP_UNPREPARED: Final = 1024

Said = Literal["prepared", "unprepared"]


class _Record(msgspec.Struct, array_like=True, frozen=True):
    generation: int
    said: Said


class _File(msgspec.Struct, kw_only=True, rename="camel"):
    boot_id: str
    #: By claim UID, the least recently changed first.
    claims: dict[str, _Record] = msgspec.field(default_factory=dict)


class ToldLedger:
    """The generation of each claim's preparation on this node, kept in ``path``.

    ``path`` ``None`` keeps it in memory only (a process that never restarts, or a test).
    """

    def __init__(self, path: Path | None, *, boot_id: str) -> None:
        self.path = path
        self._boot_id = boot_id
        self._file = _File(boot_id=boot_id)

    def prepared(self, uid: str, *, again: bool) -> int:
        """The generation to tell a preparation of ``uid`` under.

        A new preparation (``again`` False) takes the next generation. A preparation told
        again takes the one last told prepared, or the next if the last thing told of the
        claim was its unprepare (the first telling of this preparation never happened).
        """
        current = self._read().claims.get(uid)
        if current is None:
            generation = 1
        elif again and current.said == "prepared":
            generation = current.generation
        else:
            generation = current.generation + 1
        self._write(uid, _Record(generation, "prepared"))
        return generation

    def unprepared(self, uid: str) -> int:
        """The generation to tell the unprepare of ``uid`` under: its preparation's."""
        current = self._read().claims.get(uid)
        generation = current.generation if current is not None else 1
        self._write(uid, _Record(generation, "unprepared"))
        return generation

    def _read(self) -> _File:
        if self.path is None:
            return self._file
        try:
            found = msgspec.json.decode(self.path.read_bytes(), type=_File)
        except FileNotFoundError:
            found = _File(boot_id=self._boot_id)
        except (OSError, msgspec.DecodeError) as exc:
            log.warning(
                "claim event ledger unreadable, starting a new one",
                extra={"path": str(self.path), "error": str(exc)},
            )
            found = _File(boot_id=self._boot_id)
        if found.boot_id != self._boot_id:
            found = _File(boot_id=self._boot_id)  # a reboot: every claim starts over
        self._file = found
        return found

    def _write(self, uid: str, record: _Record) -> None:
        claims = self._file.claims
        claims.pop(uid, None)
        claims[uid] = record
        told_unprepared = [u for u, r in claims.items() if r.said == "unprepared"]
        for forgotten in told_unprepared[: max(len(told_unprepared) - KEEP_UNPREPARED, 0)]:
            del claims[forgotten]
        if self.path is None:
            return
        # One temporary file per process: a rolling update's two processes write it too.
        temp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            temp.write_bytes(msgspec.json.encode(self._file))
            os.replace(temp, self.path)
        except OSError as exc:
            log.warning(
                "claim event ledger not written",
                extra={"path": str(self.path), "error": str(exc)},
            )
