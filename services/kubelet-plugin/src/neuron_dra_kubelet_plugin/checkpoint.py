"""The plugin's record of prepared claims: versioned, checksummed, written atomically.

File format (JSON)::

    {"version": 1, "checksum": "sha256:<hex>", "data": {"claims": {"<uid>": {...}}}}

The checksum covers the canonical form of ``data`` *as stored* (keys sorted, no spaces),
not a re-encoding of what this code understands. So a later release that adds a field
writes files this release still verifies, and this release verifies files written before
a field was added. Older format versions are upgraded by :data:`MIGRATIONS` on load.

Each claim goes through two phases: ``PrepareStarted`` is written before any side effect
(the CDI spec), ``PrepareCompleted`` after all of them. An entry found in the first phase
after a restart is a half-done prepare to roll back. Every entry carries the node's boot id:
after a reboot nothing prepared before it is in effect any more, and the entries are stale.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import msgspec
from neuron_dra_common.files import replace_file

__all__ = [
    "BOOT_ID_PATH",
    "CHECKPOINT_VERSION",
    "MIGRATIONS",
    "Checkpoint",
    "CheckpointCorrupted",
    "CheckpointError",
    "CheckpointStore",
    "ClaimEntry",
    "ClaimState",
    "DeviceConflict",
    "PreparedDevice",
    "UnsupportedCheckpointVersion",
    "decode_checkpoint",
    "encode_checkpoint",
    "read_boot_id",
]

CHECKPOINT_VERSION = 1
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")

#: ``version -> function`` that upgrades the ``data`` of that version to the next one.
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}


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


class PreparedDevice(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """One device of a prepared claim, as answered to the kubelet."""

    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...] = ()


class ClaimEntry(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    uid: str
    namespace: str
    name: str
    state: ClaimState
    boot_id: str
    devices: tuple[PreparedDevice, ...] = ()

    def __str__(self) -> str:
        return f"ResourceClaim {self.namespace}/{self.name} ({self.uid})"


class DeviceConflict(msgspec.Struct, frozen=True, kw_only=True):
    """``device`` of pool ``pool`` is held by ``holder``."""

    pool: str
    device: str
    holder: ClaimEntry


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

    def conflicts(self, uid: str, devices: Iterable[tuple[str, str]]) -> tuple[DeviceConflict, ...]:
        """Which of ``(pool, device)`` are already held by a claim other than ``uid``."""
        held = {
            (d.pool, d.device): entry
            for entry in self.claims.values()
            if entry.uid != uid
            for d in entry.devices
        }
        return tuple(
            DeviceConflict(pool=pool, device=device, holder=held[(pool, device)])
            for pool, device in devices
            if (pool, device) in held
        )


class _File(msgspec.Struct, kw_only=True):
    version: int
    checksum: str
    data: msgspec.Raw


def _canonical(data: Any) -> bytes:
    return msgspec.json.encode(data, order="sorted")


def _checksum(data: Any) -> str:
    return "sha256:" + hashlib.sha256(_canonical(data)).hexdigest()


def encode_checkpoint(checkpoint: Checkpoint) -> bytes:
    """The file bytes of ``checkpoint`` at :data:`CHECKPOINT_VERSION`."""
    # Encoding the Struct with sorted keys gives the canonical form directly (the same bytes
    # as re-encoding its decoded JSON sorted, which is what a reader checks against).
    canonical = _canonical(checkpoint)
    checksum = "sha256:" + hashlib.sha256(canonical).hexdigest()
    return msgspec.json.encode(
        {"version": CHECKPOINT_VERSION, "checksum": checksum, "data": msgspec.Raw(canonical)},
        order="sorted",
    )


def decode_checkpoint(raw: bytes, *, source: str = "<memory>") -> Checkpoint:
    """Verify and decode checkpoint file bytes (upgrading older versions).

    Raises :class:`CheckpointCorrupted` or :class:`UnsupportedCheckpointVersion`.
    """
    try:
        envelope = msgspec.json.decode(raw, type=_File)
        data = msgspec.json.decode(envelope.data)
    except msgspec.DecodeError as exc:
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
        return msgspec.convert(data, type=Checkpoint)
    except msgspec.ValidationError as exc:
        raise CheckpointCorrupted(source, f"data: {exc}") from exc


class CheckpointStore:
    """Reads and atomically replaces one checkpoint file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._temp = path.with_name(f".{path.name}.tmp")

    def load(self) -> Checkpoint:
        """The stored checkpoint; empty when there is no file yet."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return Checkpoint()
        return decode_checkpoint(raw, source=str(self.path))

    def load_or_quarantine(self) -> tuple[Checkpoint, CheckpointError | None]:
        """Like :meth:`load`, but an unreadable file is moved aside instead of failing.

        The caller reports the returned error and starts from an empty checkpoint (rebuilt
        from what is on disk), so a corrupted file never makes the plugin crash-loop. The
        bad file stays next to the checkpoint as ``<name>.corrupt`` for inspection.
        """
        try:
            return self.load(), None
        except CheckpointError as exc:
            aside = self.path.with_name(self.path.name + ".corrupt")
            os.replace(self.path, aside)
            return Checkpoint(), exc

    def save(self, checkpoint: Checkpoint) -> None:
        """Replace the file atomically: write a temporary file, rename it over the old one.

        The rename is what a crash of the plugin (kill -9 at any step) needs: the file is
        always the old or the new version, never half of one. It is not flushed to disk:
        every entry is only valid within the boot that wrote it (``boot_id``), so a
        checkpoint that would survive a power loss is dropped as stale on the next boot
        anyway, and one that does not survive is reported as corrupted and set aside —
        the same outcome without a disk flush per prepare.
        """
        replace_file(self.path, self._temp, encode_checkpoint(checkpoint), mode=0o600)

    def remove_leftovers(self) -> None:
        """Drop a temporary file an interrupted save left behind."""
        with contextlib.suppress(FileNotFoundError):
            self._temp.unlink()


def read_boot_id(path: Path = BOOT_ID_PATH) -> str:
    """The kernel's boot id: changes on every reboot."""
    return path.read_text().strip()
