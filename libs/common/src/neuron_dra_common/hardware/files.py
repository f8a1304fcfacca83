"""Reading small driver files without ever failing the caller.

Every reader here turns "missing", "unreadable" and "garbage" into a :class:`HardwareProblem`
that is both logged (structured, via ``extra=``) and collected, and returns ``None``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from neuron_dra_common.hardware.model import Counter, HardwareProblem

__all__ = ["ProblemLog", "parse_int", "parse_int_list", "read_small"]

T = TypeVar("T")

log = logging.getLogger("neuron_dra_common.hardware")

#: A sysfs attribute is at most a page; one read takes it whole.
_PAGE = 4096


def read_small(path: Path | str) -> str:
    """A small file's whole content as UTF-8 text: an open, a read, a close. The probe and
    discovery read a node's ~1,500 driver files every few seconds, and a text-mode open
    adds buffering, a terminal check and a decoder to each."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, _PAGE)
        if len(data) == _PAGE:  # longer than a page (not sysfs): read on to the end
            chunks = [data]
            while chunk := os.read(fd, _PAGE):
                chunks.append(chunk)
            data = b"".join(chunks)
    finally:
        os.close(fd)
    return data.decode("utf-8")


class ProblemLog:
    """Collects what could not be read, logging each entry as it is added."""

    def __init__(self) -> None:
        self._items: list[HardwareProblem] = []

    @property
    def items(self) -> tuple[HardwareProblem, ...]:
        """Every problem so far, in the order found."""
        return tuple(self._items)

    def add(
        self,
        path: Path | str,
        reason: str,
        *,
        device: int | None = None,
        fatal: bool = False,
    ) -> None:
        """Record and log one problem."""
        problem = HardwareProblem(path=str(path), reason=reason, device=device, fatal=fatal)
        self._items.append(problem)
        log.warning(
            "hardware value not read: %s: %s",
            problem.path,
            reason,
            extra={"path": problem.path, "reason": reason, "device": device, "fatal": fatal},
        )

    def extend(self, problems: tuple[HardwareProblem, ...]) -> None:
        """Take over problems another reader already logged."""
        self._items.extend(problems)

    def text(self, path: Path | str, *, device: int | None = None) -> str | None:
        """The file's content, or ``None`` (and a problem) when it cannot be read."""
        try:
            return read_small(path)
        except FileNotFoundError:
            self.add(path, "missing", device=device)
        except (OSError, UnicodeDecodeError) as exc:
            self.add(path, f"unreadable: {exc.__class__.__name__}: {exc}", device=device)
        return None

    def value(
        self, path: Path | str, parse: Callable[[str], T], *, device: int | None = None
    ) -> T | None:
        """The file's stripped content through ``parse``; ``None`` and a problem on failure."""
        raw = self.text(path, device=device)
        if raw is None:
            return None
        try:
            return parse(raw.strip())
        except ValueError as exc:
            self.add(path, f"unexpected content {raw.strip()[:64]!r}: {exc}", device=device)
            return None

    def counter(self, directory: Path | str, *, device: int | None = None) -> Counter | None:
        """A ``{total, present}`` statistics directory as a :class:`Counter`."""
        # Joined as text: a path object per file costs as much as reading it.
        total = self.value(f"{directory}/total", parse_int, device=device)
        present = self.value(f"{directory}/present", parse_int, device=device)
        if total is None or present is None:
            return None
        return Counter(total=total, present=present)


def parse_int(raw: str) -> int:
    """A decimal integer, surrounding whitespace ignored."""
    return int(raw.strip(), 10)


def parse_int_list(raw: str) -> tuple[int, ...]:
    """``"12, 3, 4, 1"`` -> ``(12, 3, 4, 1)``; an empty string is an empty tuple."""
    parts = [p.strip() for p in raw.replace("\n", ",").split(",")]
    return tuple(int(p, 10) for p in parts if p)
