"""Small files replaced atomically: CDI specs and the kubelet plugin's checkpoint."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["replace_file"]


def replace_file(
    target: str | os.PathLike[str], temp: str | os.PathLike[str], data: bytes, mode: int = 0o644
) -> None:
    """Write ``data`` to ``temp`` and rename it over ``target``; parents made when missing.

    No flush: callers only need the rename's atomicity (a reader or a crash sees the old
    file or the new one, never half of one).
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    try:
        fd = os.open(temp, flags, mode)
    except FileNotFoundError:
        Path(temp).parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(temp, flags, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    os.replace(temp, target)
