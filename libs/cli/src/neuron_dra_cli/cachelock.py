"""What the build caches share: one writer per cache entry, and durations as people read them."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["duration", "locked"]


@contextlib.contextmanager
def locked(path: Path, *, progress: Callable[[str], None], what: str) -> Iterator[None]:
    """Hold an exclusive lock on ``path``; say ``waiting for <what>`` if another process has it.

    Two commands that fill the same cache entry (two test runs, ``dev up`` beside a build) take
    turns: the second finds the first one's result instead of building it again.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"waiting for {what} ({path})")
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def duration(seconds: float) -> str:
    """``75.2`` -> ``1m15s``; under a minute ``42s``.

    >>> duration(75.2), duration(42)
    ('1m15s', '42s')
    """
    m, s = divmod(int(seconds), 60)
    return f"{m}m{s:02d}s" if m else f"{s}s"
