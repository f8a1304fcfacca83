"""The plugin's record of prepared claims: versioned, checksummed, crash-safe.

Two files. The **base** (JSON), replaced atomically (temporary file renamed over it)::

    {"version": 2, "checksum": "sha256:<hex>", "data": {"claims": {"<uid>": {...}}}}

and beside it the **journal** (``<base>.journal``), one line per change since the base was
written, each ``<sha256 hex of payload> <payload>``::

    <hex> {"base":"sha256:<checksum of the base this journal extends>"}
    <hex> {"put":{...entry...}}
    <hex> {"drop":"<uid>"}

A change is one ``write`` appended to the open journal, not a rewrite of every entry; when the
journal outgrows :data:`JOURNAL_LIMIT` the next change writes a new base and starts a new
journal. The journal applies only to the base its first line names: a crash between writing
a new base and starting its journal leaves an old journal that is ignored (the new base
already holds all it said). A line cut short by a crash (no newline) is a change that never
took effect; a complete line whose checksum fails is corruption.

Checksums cover the bytes *as stored* (for the base: the canonical form of ``data``, keys
sorted, no spaces), not a re-encoding of what this code understands. So a later release
that adds a field writes files this release still verifies, and this release verifies files
written before a field was added. Older base versions are upgraded by :data:`MIGRATIONS` on
load; version 1 had no journal (its data is the same), and this release writes version 2 so
that a release that does not know journals refuses the file instead of missing changes.

Each claim goes through two phases: ``PrepareStarted`` is written before any side effect
(the CDI spec), ``PrepareCompleted`` after all of them. An entry found in the first phase
after a restart is a half-done prepare to roll back. Every entry carries the node's boot id:
after a reboot nothing prepared before it is in effect any more, and the entries are stale.

Two plugin processes may share the files (a rolling update runs the new pod beside the old
one). They change them only under the node lock (:mod:`~neuron_dra_kubelet_plugin.nodelock`),
and :meth:`CheckpointStore.is_current` tells a store whether the other process wrote since its
own last write; if so the store loads again and writes a new base instead of appending to a
journal that may no longer be the one on disk. The files do not change for that: a release
without the lock reads them as before.

Nothing is flushed to disk: every entry is only valid within the boot that wrote it, so a
checkpoint that would survive a power loss is dropped as stale on the next boot anyway, and
one that does not survive is reported as corrupted and set aside (the node's ``/run`` is a
tmpfs, where neither happens). A crash of the plugin (kill -9 at any step) is what the
rename and the journal protect against.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
from neuron_dra_common.files import replace_file

__all__ = [
    "BOOT_ID_PATH",
    "CHECKPOINT_VERSION",
    "JOURNAL_LIMIT",
    "MIGRATIONS",
    "Change",
    "Checkpoint",
    "CheckpointCorrupted",
    "CheckpointError",
    "CheckpointStore",
    "ClaimEntry",
    "ClaimState",
    "PreparedDevice",
    "UnsupportedCheckpointVersion",
    "decode_checkpoint",
    "encode_checkpoint",
    "read_boot_id",
]

CHECKPOINT_VERSION = 2
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
#: Journal size (bytes) past which the next change writes a new base instead.
JOURNAL_LIMIT = 256 * 1024


def _from_v1(data: dict[str, Any]) -> dict[str, Any]:
    # Version 2 has the same data; what changed is the journal beside it.
    return data


#: ``version -> function`` that upgrades the ``data`` of that version to the next one.
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _from_v1}


class CheckpointError(Exception):
    """The checkpoint cannot be used; ``path`` says which file."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"checkpoint {path}: {reason}")


class CheckpointCorrupted(CheckpointError):
    """Not valid JSON, wrong shape, or the checksum does not match."""


class UnsupportedCheckpointVersion(CheckpointError):
    """Written by a newer release (a downgrade): this release cannot read it safely."""


class ClaimState(enum.StrEnum):
    PREPARE_STARTED = "PrepareStarted"
    PREPARE_COMPLETED = "PrepareCompleted"


class PreparedDevice(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """One device of a prepared claim, as answered to the kubelet.

    ``admin_access``: allocated with ``adminAccess: true`` (a monitoring claim), which holds
    nothing: the device stays available to other claims, and other claims' devices to it.
    Omitted when false, so an entry of an ordinary claim is written byte for byte as before
    the field existed. A release without the field still reads every entry, but counts an
    admin-access device as held (after a downgrade, until the monitor's claim is unprepared).
    """

    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...] = ()
    admin_access: bool = False


class ClaimEntry(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    uid: str
    namespace: str
    name: str
    state: ClaimState
    boot_id: str
    devices: tuple[PreparedDevice, ...] = ()

    def __str__(self) -> str:
        return f"ResourceClaim {self.namespace}/{self.name} ({self.uid})"


class Checkpoint(msgspec.Struct, frozen=True, kw_only=True):
    """All claims the plugin has prepared (or started to), keyed by claim UID.

    Immutable: the update methods return a new checkpoint.
    """

    claims: dict[str, ClaimEntry] = msgspec.field(default_factory=dict)

    def with_entry(self, entry: ClaimEntry) -> Checkpoint:
        return Checkpoint(claims={**self.claims, entry.uid: entry})

    def without(self, uid: str) -> Checkpoint:
        return Checkpoint(claims={k: v for k, v in self.claims.items() if k != uid})

    def half_done(self) -> tuple[ClaimEntry, ...]:
        """Entries whose prepare started and did not complete (to roll back)."""
        return tuple(e for e in self.claims.values() if e.state is ClaimState.PREPARE_STARTED)

    def stale(self, boot_id: str) -> tuple[ClaimEntry, ...]:
        """Entries written before the node's last reboot."""
        return tuple(e for e in self.claims.values() if e.boot_id != boot_id)


class _File(msgspec.Struct, kw_only=True):
    version: int
    checksum: str
    data: msgspec.Raw


def _canonical(data: Any) -> bytes:
    return msgspec.json.encode(data, order="sorted")


def _checksum(data: Any) -> str:
    return "sha256:" + hashlib.sha256(_canonical(data)).hexdigest()


def _encode(checkpoint: Checkpoint) -> tuple[bytes, str]:
    # Encoding the Struct with sorted keys gives the canonical form directly (the same bytes
    # as re-encoding its decoded JSON sorted, which is what a reader checks against).
    canonical = _canonical(checkpoint)
    checksum = "sha256:" + hashlib.sha256(canonical).hexdigest()
    raw = msgspec.json.encode(
        {"version": CHECKPOINT_VERSION, "checksum": checksum, "data": msgspec.Raw(canonical)},
        order="sorted",
    )
    return raw, checksum


def encode_checkpoint(checkpoint: Checkpoint) -> bytes:
    """The base file bytes of ``checkpoint`` at :data:`CHECKPOINT_VERSION`."""
    return _encode(checkpoint)[0]


def decode_checkpoint(raw: bytes, *, source: str = "<memory>") -> Checkpoint:
    """Verify and decode base file bytes (upgrading older versions).

    Raises :class:`CheckpointCorrupted` or :class:`UnsupportedCheckpointVersion`.
    """
    return _decode(raw, source)[0]


def _decode(raw: bytes, source: str) -> tuple[Checkpoint, str]:
    try:
        envelope = msgspec.json.decode(raw, type=_File)
        data = msgspec.json.decode(envelope.data)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:  # a string that is not UTF-8
        raise CheckpointCorrupted(source, f"not a checkpoint file: {exc}") from exc
    if envelope.checksum != _checksum(data):
        raise CheckpointCorrupted(source, "checksum does not match the content")
    if envelope.version > CHECKPOINT_VERSION:
        raise UnsupportedCheckpointVersion(
            source,
            f"format version {envelope.version} is newer than {CHECKPOINT_VERSION}, the "
            "newest this release reads",
        )
    if envelope.version < 1 or not isinstance(data, dict):
        raise CheckpointCorrupted(source, f"format version {envelope.version} is unknown")
    version = envelope.version
    while version < CHECKPOINT_VERSION:
        data = MIGRATIONS[version](data)
        version += 1
    try:
        return msgspec.convert(data, type=Checkpoint), envelope.checksum
    except msgspec.ValidationError as exc:
        raise CheckpointCorrupted(source, f"data: {exc}") from exc


#: A change of the checkpoint as the journal records it: an entry put (added or replaced)
#: or the UID of an entry dropped.
Change = ClaimEntry | str


class _Line(msgspec.Struct, kw_only=True):
    """One journal line's payload: the header (``base``) or one change."""

    base: str | None = None
    put: ClaimEntry | None = None
    drop: str | None = None


_LINE_ENCODER = msgspec.json.Encoder()


def _journal_line(payload: bytes) -> bytes:
    return hashlib.sha256(payload).hexdigest().encode() + b" " + payload + b"\n"


def _change_line(change: Change) -> bytes:
    if isinstance(change, str):
        return _journal_line(_LINE_ENCODER.encode({"drop": change}))
    return _journal_line(b'{"put":' + _LINE_ENCODER.encode(change) + b"}")


def _replay(journal: bytes, base: Checkpoint, base_checksum: str, source: str) -> Checkpoint:
    """``base`` with the changes of ``journal`` applied, if the journal extends that base."""
    lines = journal.split(b"\n")
    # The last piece is empty when the journal ends with a newline; otherwise it is a line a
    # crash cut short: a change whose commit never returned, so it never took effect.
    claims: dict[str, ClaimEntry] | None = None
    for number, line in enumerate(lines[:-1], start=1):
        digest, _, payload = line.partition(b" ")
        if hashlib.sha256(payload).hexdigest().encode() != digest:
            raise CheckpointCorrupted(source, f"line {number}: checksum does not match")
        try:
            record = msgspec.json.decode(payload, type=_Line)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            raise CheckpointCorrupted(source, f"line {number}: {exc}") from exc
        if claims is None:
            if record.base != base_checksum:
                return base  # the journal of another base: that base is gone or holds it
            claims = dict(base.claims)
        elif record.put is not None:
            claims[record.put.uid] = record.put
        elif record.drop is not None:
            claims.pop(record.drop, None)
        else:
            raise CheckpointCorrupted(source, f"line {number}: neither put nor drop")
    return base if claims is None else Checkpoint(claims=claims)


class CheckpointStore:
    """The base file and its journal: loads both, appends changes, writes new bases."""

    def __init__(self, path: Path, *, journal_limit: int = JOURNAL_LIMIT) -> None:
        self.path = path
        self.journal = path.with_name(f"{path.name}.journal")
        self._temp = path.with_name(f".{path.name}.tmp")
        self._journal_temp = path.with_name(f".{path.name}.journal.tmp")
        self._limit = journal_limit
        # The journal this store appends to (opened by save), and its size.
        self._fd: int | None = None
        self._size = 0
        # The base this store last wrote, kept open so that its inode cannot be reused by a
        # file written later: the identities of both files tell whether another process
        # replaced either since (see is_current).
        self._base_fd: int | None = None
        self._identity: tuple[tuple[int, int], tuple[int, int]] | None = None

    def is_current(self) -> bool:
        """Whether the files on disk are exactly what this store last wrote.

        False when another process (a second plugin pod during a rolling update) replaced
        the base or the journal or appended to the journal since, and when this store has
        not written yet: then the checkpoint must be loaded again before it is changed.
        """
        if self._fd is None or self._identity is None:
            return False
        try:
            base, journal = os.stat(self.path), os.stat(self.journal)
        except FileNotFoundError:
            return False
        return (
            (base.st_dev, base.st_ino),
            (journal.st_dev, journal.st_ino),
        ) == self._identity and journal.st_size == self._size

    def load(self) -> Checkpoint:
        """The stored checkpoint (base plus journal); empty when there is no file yet.

        The next change after a load writes a new base: what this store had open may be
        files another process has replaced since.
        """
        self._close()
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return Checkpoint()
        base, checksum = _decode(raw, str(self.path))
        try:
            journal = self.journal.read_bytes()
        except FileNotFoundError:
            return base
        return _replay(journal, base, checksum, str(self.journal))

    def load_or_quarantine(self) -> tuple[Checkpoint, CheckpointError | None]:
        """Like :meth:`load`, but unreadable files are moved aside instead of failing.

        The caller reports the returned error and starts from an empty checkpoint (rebuilt
        from what is on disk), so a corrupted file never makes the plugin crash-loop. The
        bad files stay next to the checkpoint as ``<name>.corrupt`` for inspection.
        """
        try:
            return self.load(), None
        except CheckpointError as exc:
            for path in (self.path, self.journal):
                with contextlib.suppress(FileNotFoundError):
                    os.replace(path, path.with_name(path.name + ".corrupt"))
            return Checkpoint(), exc

    def save(self, checkpoint: Checkpoint) -> None:
        """Write ``checkpoint`` as a new base and start an empty journal for it.

        Base first, then the journal: a crash in between leaves the old journal, which
        names the old base and is ignored.
        """
        raw, checksum = _encode(checkpoint)
        replace_file(self.path, self._temp, raw, mode=0o600)
        self._close()
        self._base_fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        header = _journal_line(_LINE_ENCODER.encode({"base": checksum}))
        replace_file(self.journal, self._journal_temp, header, mode=0o600)
        self._fd = os.open(self.journal, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self._size = len(header)
        base, journal = os.fstat(self._base_fd), os.fstat(self._fd)
        self._identity = ((base.st_dev, base.st_ino), (journal.st_dev, journal.st_ino))

    def append(self, changes: Sequence[Change], current: Checkpoint) -> None:
        """Record ``changes`` (which made ``current``): one append to the journal.

        With no journal open yet, one grown past the limit, or after a failed append, a new
        base holding ``current`` is written instead.
        """
        if self._fd is None or self._size >= self._limit:
            self.save(current)
            return
        data = b"".join(_change_line(c) for c in changes)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
        except BaseException:
            # What reached the file may end in half a line; never append after it.
            self._close()
            raise
        self._size += len(data)

    def close(self) -> None:
        """Close the journal (the files stay)."""
        self._close()

    def _close(self) -> None:
        journal, base = self._fd, self._base_fd
        self._fd = self._base_fd = self._identity = None
        try:
            if base is not None:
                os.close(base)
        finally:
            if journal is not None:
                os.close(journal)

    def remove_leftovers(self) -> None:
        """Drop temporary files an interrupted save left behind."""
        for temp in (self._temp, self._journal_temp):
            with contextlib.suppress(FileNotFoundError):
                temp.unlink()


def read_boot_id(path: Path = BOOT_ID_PATH) -> str:
    """The kernel's boot id: changes on every reboot."""
    return path.read_text().strip()
