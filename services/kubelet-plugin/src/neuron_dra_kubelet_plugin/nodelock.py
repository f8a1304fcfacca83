"""One lock for the whole node, held while a plugin process changes the checkpoint.

The DaemonSet rolls with ``maxSurge: 1``, so for a while two plugin processes serve one node
and share its checkpoint and CDI specs. Each prepare and unprepare (and the recovery at
start) runs under an exclusive ``flock`` on a file beside the checkpoint, so only one process
changes them at a time, and each re-reads what the other wrote before deciding. The kernel
releases the lock when its holder dies, so a crash never leaves the node locked.

Every acquisition opens the file anew: ``flock`` locks belong to an open file, so two
holders in one process exclude each other exactly like two processes do, and no descriptor
stays open between operations. The file is never removed (removing a lock file lets two
processes lock two different files).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

__all__ = ["NODE_LOCK_TIMEOUT", "NodeLock", "NodeLockTimeout", "lock_path_for"]

#: Seconds to wait for another process's hold. A hold lasts a few file writes: waiting
#: this long means that process is stuck, and the caller's error says so.
NODE_LOCK_TIMEOUT = 20.0
# Polling, not a blocking flock in a thread: a waiting coroutine stays cancellable.
_FIRST_WAIT = 0.001
_LONGEST_WAIT = 0.05


class NodeLockTimeout(Exception):
    """Another process held the node lock for longer than the timeout."""


def lock_path_for(checkpoint: Path) -> Path:
    """The lock file of ``checkpoint``: beside it, so both pods see the same one.

    >>> lock_path_for(Path("/run/neuron-dra/checkpoint.json"))
    PosixPath('/run/neuron-dra/checkpoint.json.lock')
    """
    return checkpoint.with_name(f"{checkpoint.name}.lock")


class NodeLock:
    """An exclusive ``flock`` on ``path``, for coroutines (:meth:`held`) or at start
    (:meth:`held_now`)."""

    def __init__(self, path: Path, *, timeout: float = NODE_LOCK_TIMEOUT) -> None:
        self.path = path
        self.timeout = timeout

    def _open(self) -> int:
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
        try:
            return os.open(self.path, flags, 0o600)
        except FileNotFoundError:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return os.open(self.path, flags, 0o600)

    @staticmethod
    def _try(fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def _timeout(self) -> NodeLockTimeout:
        return NodeLockTimeout(
            f"node lock {self.path}: another plugin process has held it for more than "
            f"{self.timeout:g} s"
        )

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """Hold the lock for the block, waiting without blocking the event loop."""
        fd = self._open()
        try:
            if not self._try(fd):
                deadline = time.monotonic() + self.timeout
                wait = _FIRST_WAIT
                while not self._try(fd):
                    if time.monotonic() >= deadline:
                        raise self._timeout()
                    await asyncio.sleep(wait)
                    wait = min(wait * 2, _LONGEST_WAIT)
            yield
        finally:
            os.close(fd)  # releases the lock with the open file

    @contextlib.contextmanager
    def held_now(self) -> Iterator[None]:
        """Hold the lock for the block, waiting in this thread (before anything is served)."""
        fd = self._open()
        try:
            deadline = time.monotonic() + self.timeout
            wait = _FIRST_WAIT
            while not self._try(fd):
                if time.monotonic() >= deadline:
                    raise self._timeout()
                time.sleep(wait)
                wait = min(wait * 2, _LONGEST_WAIT)
            yield
        finally:
            os.close(fd)
