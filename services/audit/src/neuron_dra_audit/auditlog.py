"""The audit file: JSON lines appended, rotated by size, read back at start for de-duplication.

Crash safety without a second store:

- a line is written with one ``write`` on a file opened for appending, then flushed to the
  kernel before the message is acknowledged, so a ``kill -9`` after the write keeps it (and
  ``fsync`` also keeps it through a machine crash);
- a message written but whose acknowledgement was lost comes back after a restart: its id is
  among the ids read back from the file's last lines, so it is not written twice;
- a line cut short (the process died inside the write) is cut off at start: its message was
  not acknowledged, so it comes back and is written whole.

Rotation keeps ``FILE`` (current), ``FILE.1`` (newest old) .. ``FILE.<backups>``, like
logrotate's numbering, so shippers that follow a file by name pick up the new one.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from pathlib import Path
from typing import BinaryIO, Final

from neuron_dra_common.bus import cloud_event_id

__all__ = ["AuditLog", "read_tail_ids"]

log = logging.getLogger(__name__)

_CHUNK: Final = 1 << 20


def _tail_lines(path: Path, count: int) -> list[bytes]:
    """The last ``count`` complete lines of ``path`` (oldest first), reading backwards."""
    if count <= 0:
        return []
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return []
    with f:
        end = f.seek(0, os.SEEK_END)
        buf = b""
        pos = end
        while pos > 0 and buf.count(b"\n") <= count:
            step = min(_CHUNK, pos)
            pos -= step
            f.seek(pos)
            buf = f.read(step) + buf
    lines = buf.split(b"\n")
    if pos > 0:
        lines = lines[1:]  # the first piece may be the end of an earlier line
    return [line for line in lines if line][-count:]


def read_tail_ids(path: Path, count: int) -> list[str]:
    """Ids of the last ``count`` events written to ``path`` and, if it holds fewer, to the
    newest rotated file (``path.1``), oldest first."""
    lines = _tail_lines(path, count)
    if len(lines) < count:
        lines = _tail_lines(path.with_name(path.name + ".1"), count - len(lines)) + lines
    return [i for i in (cloud_event_id(line) for line in lines) if i]


def _cut_partial_line(path: Path) -> int:
    """Cut a last line that does not end with a newline; return how many bytes were cut."""
    try:
        f = path.open("r+b")
    except FileNotFoundError:
        return 0
    with f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        pos = size
        while pos > 0:
            step = min(_CHUNK, pos)
            pos -= step
            f.seek(pos)
            chunk = f.read(step)
            at = chunk.rfind(b"\n")
            if at >= 0:
                keep = pos + at + 1
                break
        else:
            keep = 0
        f.truncate(keep)
        return size - keep


class AuditLog:
    """Appends lines to ``path`` and rotates it before it would pass ``max_bytes``.

    ``seen`` remembers the ids of the last ``remember`` events written (those read back at
    start, then those written since): :meth:`written` tells a handler an event is there.
    """

    def __init__(
        self, path: Path, *, max_bytes: int, backups: int, fsync: bool, remember: int
    ) -> None:
        self.path = path
        self._max_bytes = max_bytes
        self._backups = backups
        self._fsync = fsync
        self._order: deque[str] = deque(maxlen=max(remember, 1))
        self._seen: set[str] = set()
        self._file: BinaryIO | None = None
        self._size = 0
        self.rotations = 0
        self.cut_bytes = 0
        self._remember = remember

    def open(self) -> None:
        """Open for appending; cut a partial last line and read back the last ids."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.cut_bytes = _cut_partial_line(self.path)
        if self.cut_bytes:
            log.warning(
                "cut a partial last line (its event comes back from the stream)",
                extra={"file": str(self.path), "bytes": self.cut_bytes},
            )
        for event_id in read_tail_ids(self.path, self._remember):
            self._note(event_id)
        self._file = self.path.open("ab", buffering=0)
        self._size = self._file.seek(0, os.SEEK_END)

    def _note(self, event_id: str) -> None:
        if len(self._order) == self._order.maxlen:
            self._seen.discard(self._order[0])
        self._order.append(event_id)
        self._seen.add(event_id)

    def written(self, event_id: str) -> bool:
        return event_id in self._seen

    def write(self, event_id: str, line: bytes) -> None:
        """Append ``line`` (one write, unbuffered: in the kernel when this returns)."""
        if self._file is None:
            raise RuntimeError(f"audit log {self.path} is not open")
        if self._size and self._size + len(line) > self._max_bytes:
            self._rotate()
        self._file.write(line)
        self._size += len(line)
        if self._fsync:
            os.fsync(self._file.fileno())
        self._note(event_id)

    def _rotate(self) -> None:
        assert self._file is not None
        if self._fsync:
            os.fsync(self._file.fileno())
        self._file.close()
        name = self.path.name
        if self._backups == 0:
            self.path.unlink(missing_ok=True)
        else:
            oldest = self.path.with_name(f"{name}.{self._backups}")
            oldest.unlink(missing_ok=True)
            for n in range(self._backups - 1, 0, -1):
                src = self.path.with_name(f"{name}.{n}")
                if src.exists():
                    src.rename(self.path.with_name(f"{name}.{n + 1}"))
            self.path.rename(self.path.with_name(f"{name}.1"))
        self._file = self.path.open("ab", buffering=0)
        self._size = 0
        self.rotations += 1

    @property
    def size(self) -> int:
        return self._size

    def close(self) -> None:
        if self._file is not None:
            if self._fsync:
                os.fsync(self._file.fileno())
            self._file.close()
            self._file = None
