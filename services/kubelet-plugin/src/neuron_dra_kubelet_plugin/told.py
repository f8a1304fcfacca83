"""What the plugin last told of each claim: under which id, and whether it left the process.

A claim's events carry a CloudEvents id that the bus (its duplicate window) and every
consumer (the audit among them) take as "the same event" when it comes again. A
ResourceClaim can be prepared on a node, unprepared, and prepared again (a standalone claim
used by one pod after another), and each of those is a new event: so the id names the
preparation, its *generation* on this node since the node booted. A change told again (the
kubelet's retry after a process died between the disk and the bus) keeps its generation and
so its id.

It is also the plugin's outbox. The kubelet's call is answered before its event is
published (the kubelet must not wait for the bus), so a process that dies in between would
lose an event the kubelet has no reason to ask again for. Each record says whether its event
was published (the bus acknowledged it); a starting process tells again what was not, under
the same id, which the bus drops if it was stored after all.

The ledger is a small file beside the checkpoint (``told.json``), which the checkpoint's
format and the previous release know nothing of. It is written (to a temporary file,
renamed) before the event is queued, and read again before a change when another process
wrote it since (the two processes of a rolling update share it). That an event was
published is written with the next change, or when the plugin stops: a mark lost with a
killed process only means the event is told again, under its id. Losing the file costs no
claim state, only these guarantees.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Final, Literal, NamedTuple

import msgspec
from neuron_dra_common.files import replace_file

__all__ = ["KEEP_UNPREPARED", "Said", "Told", "ToldLedger"]

log = logging.getLogger(__name__)

#: How many claims told unprepared (and published) the ledger keeps, the oldest forgotten
#: first: a claim prepared again after this many others came and went on the node starts
#: over at 1.
KEEP_UNPREPARED: Final = 1024

Said = Literal["prepared", "unprepared"]


_ENCODER: Final = msgspec.json.Encoder()


class _Record(msgspec.Struct, array_like=True, frozen=True):
    generation: int
    said: Said
    namespace: str = ""
    name: str = ""
    published: bool = False


class Told(NamedTuple):
    """The last event told of a claim, and whether the bus has it."""

    uid: str
    namespace: str
    name: str
    generation: int
    said: Said
    published: bool


class _File(msgspec.Struct, kw_only=True, rename="camel"):
    boot_id: str
    #: By claim UID, the least recently changed first.
    claims: dict[str, _Record] = msgspec.field(default_factory=dict)


class ToldLedger:
    """Each claim's preparation on this node and whether its last event was published, kept
    in ``path``.

    ``path`` ``None`` keeps it in memory only (a process that never restarts, or a test).
    """

    def __init__(self, path: Path | None, *, boot_id: str) -> None:
        self.path = path
        self._boot_id = boot_id
        self._file = _File(boot_id=boot_id)
        # The file as this process last read or wrote it (inode, mtime, size): unchanged,
        # it need not be read again.
        self._known: tuple[int, int, int] | None = None
        self._unsaved = False
        # (pid, path) of this process's temporary file: written twice per claim, so its
        # name is made once (and again in a forked child).
        self._temp: tuple[int, str] | None = None

    def prepared(self, uid: str, *, again: bool, namespace: str = "", name: str = "") -> int:
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
        self._change(uid, _Record(generation, "prepared", namespace, name))
        return generation

    def unprepared(self, uid: str, *, namespace: str = "", name: str = "") -> int:
        """The generation to tell the unprepare of ``uid`` under: its preparation's."""
        current = self._read().claims.get(uid)
        generation = current.generation if current is not None else 1
        self._change(uid, _Record(generation, "unprepared", namespace, name))
        return generation

    def published(self, told: Iterable[tuple[str, int, Said]]) -> None:
        """The bus acknowledged these (claim UID, generation, what): nothing owed for them,
        unless the claim changed since."""
        claims = self._read().claims
        for uid, generation, said in told:
            record = claims.get(uid)
            if record is None or record.published:
                continue
            if (record.generation, record.said) == (generation, said):
                claims[uid] = msgspec.structs.replace(record, published=True)
                self._unsaved = True
        self._forget()

    def flush(self) -> None:
        """Write what :meth:`published` noted, if anything (the plugin stops)."""
        if self._unsaved:
            self._save()

    def told(self) -> list[Told]:
        """The last event told of every claim the ledger knows, least recently changed first."""
        return [
            Told(uid, r.namespace, r.name, r.generation, r.said, r.published)
            for uid, r in self._read().claims.items()
        ]

    def _stat(self) -> tuple[int, int, int] | None:
        assert self.path is not None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def _read(self) -> _File:
        if self.path is None:
            return self._file
        known = self._stat()
        if known is not None and known == self._known:
            return self._file
        self._known = known
        self._unsaved = False  # another process wrote it: its view wins
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

    def _change(self, uid: str, record: _Record) -> None:
        claims = self._file.claims
        claims.pop(uid, None)
        claims[uid] = record
        self._save()

    def _forget(self) -> None:
        claims = self._file.claims
        if len(claims) <= KEEP_UNPREPARED:
            return  # nothing to forget: no need to look at every record on every change
        forgettable = [u for u, r in claims.items() if r.said == "unprepared" and r.published]
        for forgotten in forgettable[: max(len(forgettable) - KEEP_UNPREPARED, 0)]:
            del claims[forgotten]

    def _save(self) -> None:
        self._forget()
        if self.path is None:
            return
        if self._temp is None or self._temp[0] != os.getpid():
            # One temporary file per process: a rolling update's two processes write it too.
            name = f".{self.path.name}.{os.getpid()}.tmp"
            self._temp = (os.getpid(), os.path.join(os.fspath(self.path.parent), name))
        try:
            replace_file(self.path, self._temp[1], _ENCODER.encode(self._file))
            self._known = self._stat()
            self._unsaved = False
        except OSError as exc:
            log.warning(
                "claim event ledger not written",
                extra={"path": str(self.path), "error": str(exc)},
            )
