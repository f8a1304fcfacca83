"""Binds on their way: pods the filter has just offered nodes to, whose bind is due.

kube-scheduler binds asynchronously: as soon as it has chosen a node for a pod it sends the
``bind`` call from a goroutine of its own and goes on to the next pod, whose ``filter`` call
can reach the extender before that ``bind`` (on the benchmark's loaded two-core machine, 6 of
200 binds came after the next filter, by up to 3.5 ms). Answered at once, that filter decides on
a ledger that misses the devices the previous pod is about to take; when both pods land on the
same node, the second bind finds no free set left and is refused, and the pod waits out the
scheduler's back-off (a second or more). So a filter first waits, a little, for the binds due:
those of pods whose filter kept a node, until each bind arrives, the pod is filtered again (it
was not bound), or :data:`BIND_GRACE` has passed since its filter (the scheduler gave the pod
up after the filter: a later plugin refused it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

__all__ = ["BIND_GRACE", "InFlight"]

#: How long after a pod's filter its bind is waited for by the next filters (seconds).
BIND_GRACE = 0.025


class InFlight:
    """Pods whose bind is due, by uid, with the time each stops being waited for."""

    def __init__(
        self, *, grace: float = BIND_GRACE, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._grace = grace
        self._clock = clock
        self._due: dict[str, float] = {}
        self._arrived = asyncio.Event()

    def __len__(self) -> int:
        return len(self._due)

    def expect(self, uid: str) -> None:
        """``uid``'s filter kept a node: its bind is due."""
        if uid:
            self._due[uid] = self._clock() + self._grace

    def arrived(self, uid: str) -> None:
        """``uid``'s bind has reserved its devices (or the pod is filtered again)."""
        if self._due.pop(uid, None) is not None:
            # Wake every waiter: each looks again at what is still due.
            woken, self._arrived = self._arrived, asyncio.Event()
            woken.set()

    async def settle(self, uid: str) -> None:
        """Before ``uid``'s filter: wait until no other pod's bind is due (each for at most
        the rest of its grace). ``uid`` itself is due no more: it is being tried again."""
        self.arrived(uid)
        while self._due:
            now = self._clock()
            for late in [u for u, until in self._due.items() if until <= now]:
                del self._due[late]
            if not self._due:
                return
            left = max(self._due.values()) - now
            try:
                await asyncio.wait_for(self._arrived.wait(), timeout=left)
            except TimeoutError:
                continue
