"""Following the kernel log: ``/dev/kmsg`` records or a text file, from a saved position.

Both readers are blocking and non-waiting: each call returns what was written since the last
one (the probe calls them off the event loop every few hundred milliseconds). Their position
(:attr:`cursor`) is saved by the probe, so a restart resumes where it stopped: nothing read
twice, nothing written meanwhile missed.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from pathlib import Path
from typing import Protocol

from neuron_dra_common.hardware.kernlog import parse_kmsg

__all__ = ["KernelLog", "KmsgReader", "TextLogReader", "open_kernel_log"]

log = logging.getLogger(__name__)

Cursor = dict[str, int]


class KernelLog(Protocol):
    @property
    def cursor(self) -> Cursor: ...

    def read_new(self) -> list[str]:
        """Messages written since the last call."""
        ...

    def close(self) -> None: ...


class KmsgReader:
    """``/dev/kmsg``: one record per read; resumes after the saved sequence number.

    Without a saved position it reads the whole ring buffer of this boot: an error the
    driver reported before the probe started is still an error.
    """

    def __init__(self, path: Path, *, cursor: Cursor | None = None) -> None:
        self._path = path
        self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self._after = int((cursor or {}).get("sequence", -1))

    @property
    def cursor(self) -> Cursor:
        return {"sequence": self._after}

    def read_new(self) -> list[str]:
        out: list[str] = []
        while True:
            try:
                data = os.read(self._fd, 8192)
            except BlockingIOError:
                return out
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    # The ring buffer overwrote records before they were read; go on.
                    log.warning("kernel log records were overwritten before being read")
                    continue
                raise
            if not data:
                return out
            try:
                record = parse_kmsg(data.decode("utf-8", "replace"))
            except ValueError as exc:
                log.warning("kernel log record skipped", extra={"error": str(exc)})
                continue
            if record.sequence <= self._after:
                continue
            self._after = record.sequence
            out.append(record.message)

    def close(self) -> None:
        os.close(self._fd)


class TextLogReader:
    """A text log file, followed like ``tail -F``: a replaced (rotated) or truncated file is
    read again from its start.

    Without a saved position it starts at the end: a text log keeps earlier boots, whose
    errors say nothing about the hardware now.
    """

    def __init__(self, path: Path, *, cursor: Cursor | None = None) -> None:
        self._path = path
        self._inode = int((cursor or {}).get("inode", -1))
        self._offset = int((cursor or {}).get("offset", -1))
        self._partial = b""
        if self._offset < 0:
            try:
                st = path.stat()
                self._inode, self._offset = st.st_ino, st.st_size
            except FileNotFoundError:
                self._inode, self._offset = -1, 0

    @property
    def cursor(self) -> Cursor:
        return {"inode": self._inode, "offset": self._offset}

    def read_new(self) -> list[str]:
        try:
            with open(self._path, "rb") as fh:
                st = os.fstat(fh.fileno())
                if st.st_ino != self._inode or st.st_size < self._offset:
                    self._inode, self._offset, self._partial = st.st_ino, 0, b""
                fh.seek(self._offset)
                data = fh.read()
        except FileNotFoundError:
            return []
        if not data:
            return []
        self._offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        # A line still being written waits for its newline.
        self._partial = lines.pop()
        return [line.decode("utf-8", "replace") for line in lines if line]

    def close(self) -> None:
        return None


def open_kernel_log(path: str, *, cursor: Cursor | None = None) -> KernelLog:
    """The reader ``path`` calls for: a character device is read as kmsg records."""
    target = Path(path)
    try:
        is_device = stat.S_ISCHR(target.stat().st_mode)
    except FileNotFoundError:
        is_device = False
    if is_device:
        return KmsgReader(target, cursor=cursor if cursor and "sequence" in cursor else None)
    return TextLogReader(target, cursor=cursor if cursor and "inode" in cursor else None)
