"""Progress of a long bench run on stderr: a line when each phase starts and ends, and every
few seconds within a phase how far it got (``slices written 3,200/8,000``), so a run of many
minutes visibly moves while the report stays alone on stdout."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TextIO

__all__ = ["EVERY_SECONDS", "Progress", "Tally", "counted", "line"]

#: How often a long phase says how far it got.
EVERY_SECONDS = 5.0


@dataclass
class Tally:
    """How far a phase got: ``done`` of ``total`` (0: no total, only the time)."""

    total: int = 0
    done: int = 0


def line(label: str, elapsed: float, text: str, tally: Tally | None = None) -> str:
    """One progress line.

    >>> line("scale 1,000", 12.34, "slices written", Tally(total=2000, done=150))
    '[scale 1,000 +12 s] slices written 150/2,000'
    >>> line("scale 100", 3.0, "steady state")
    '[scale 100 +3 s] steady state'
    """
    return f"[{label} +{elapsed:.0f} s] {text}{counted(tally)}"


def counted(tally: Tally | None) -> str:
    """`` done/total`` of a tally with a total, else nothing."""
    return f" {tally.done:,}/{tally.total:,}" if tally is not None and tally.total else ""


class Progress:
    """Prints to ``stream`` (stderr) with the time since the run began."""

    def __init__(
        self,
        label: str,
        *,
        stream: TextIO | None = None,
        every: float = EVERY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self._stream = stream
        self._every = every
        self._clock = clock
        self._t0 = clock()

    def say(self, text: str, tally: Tally | None = None) -> None:
        stream = self._stream if self._stream is not None else sys.stderr
        print(line(self.label, self._clock() - self._t0, text, tally), file=stream, flush=True)

    @contextlib.asynccontextmanager
    async def phase(
        self, name: str, total: int = 0, count: Callable[[], int] | None = None
    ) -> AsyncIterator[Tally]:
        """A phase: said when it starts, every few seconds while it runs (with the tally the
        caller advances, or ``count()``), and when it ends or fails, with how long it took."""
        tally = Tally(total=total)

        def read() -> None:
            if count is not None:
                tally.done = count()

        began = self._clock()
        self.say(f"{name} ...")

        async def tick() -> None:
            while True:
                await asyncio.sleep(self._every)
                read()
                self.say(f"{name}:" if total else f"{name}: still running", tally)

        ticker = asyncio.create_task(tick(), name=f"progress {name}")
        try:
            yield tally
        except BaseException:
            read()
            self.say(f"{name}: FAILED at{counted(tally)} after {self._clock() - began:.1f} s")
            raise
        finally:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
        read()
        self.say(f"{name}: done{counted(tally)} in {self._clock() - began:.1f} s")
