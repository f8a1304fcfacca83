"""A rate-limited work queue for level-triggered reconcile, keyed and de-duplicated.

A key waiting in the queue is there once however often it is added; a key being worked on
is not handed to a second worker, and if it was added meanwhile it comes back once the
first is done. Failures are retried with per-key exponential backoff, under an overall
rate limit (token bucket).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["QueueShutDown", "WorkQueue", "run_workers"]

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)


class QueueShutDown(Exception):
    """The queue was shut down; workers return."""


class WorkQueue(Generic[K]):
    """Keys to reconcile.

    >>> queue: WorkQueue[str] = WorkQueue(name="slices")
    >>> queue.add("ip-1")
    >>> key = await queue.get(); ...; queue.forget(key); queue.done(key)
    """

    def __init__(
        self,
        *,
        name: str,
        base_delay: float = 0.005,
        max_delay: float = 300.0,
        qps: float = 10.0,
        burst: int = 100,
    ) -> None:
        self.name = name
        self._base, self._max = base_delay, max_delay
        self._qps, self._burst = qps, burst
        self._tokens = float(burst)
        self._last_refill: float | None = None
        self._order: deque[K] = deque()
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._failures: dict[K, int] = {}
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._wake = asyncio.Event()
        self._shut = False

    def __len__(self) -> int:
        return len(self._order)

    def add(self, key: K) -> None:
        """Queue ``key`` now (a no-op if it is already waiting)."""
        if self._shut or key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._order.append(key)
            self._wake.set()

    def add_after(self, key: K, delay: float) -> None:
        """Queue ``key`` after ``delay`` seconds (the earliest of several requests wins)."""
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        when = loop.time() + delay
        timer = self._timers.get(key)
        if timer is not None:
            if timer.when() <= when:
                return
            timer.cancel()
        self._timers[key] = loop.call_at(when, self._fire, key)

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def _backoff(self, key: K) -> float:
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        per_key = min(self._max, self._base * 2.0 ** min(failures, 64))
        # Overall bucket: each retry takes a token; an empty bucket spaces retries at 1/qps.
        loop_time = asyncio.get_running_loop().time()
        if self._last_refill is not None:
            self._tokens = min(
                float(self._burst), self._tokens + (loop_time - self._last_refill) * self._qps
            )
        self._last_refill = loop_time
        self._tokens -= 1
        bucket = 0.0 if self._tokens >= 0 else -self._tokens / self._qps
        return max(per_key, bucket)

    def add_rate_limited(self, key: K) -> float:
        """Queue ``key`` again after its backoff; returns the delay chosen."""
        delay = self._backoff(key)
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        """Reset ``key``'s backoff (call after it reconciled successfully)."""
        self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    async def get(self) -> K:
        """The next key to work on; call :meth:`done` with it when finished."""
        while not self._order:
            if self._shut:
                raise QueueShutDown(self.name)
            self._wake.clear()
            await self._wake.wait()
        key = self._order.popleft()
        self._dirty.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: K) -> None:
        """Finish ``key``; if it was added while being worked on, it is queued again."""
        self._processing.discard(key)
        if key in self._dirty:
            self._order.append(key)
            self._wake.set()

    def shutdown(self) -> None:
        """Stop handing out keys once the queue is empty; pending timers are dropped."""
        self._shut = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._order.clear()
        self._dirty.clear()
        self._wake.set()


async def run_workers(
    queue: WorkQueue[K], reconcile: Callable[[K], Awaitable[None]], *, workers: int = 1
) -> None:
    """Run ``workers`` loops: reconcile each key; on failure retry it with backoff.

    Returns after :meth:`WorkQueue.shutdown` once the workers finished their keys.
    """

    async def worker() -> None:
        while True:
            try:
                key = await queue.get()
            except QueueShutDown:
                return
            try:
                await reconcile(key)
            except asyncio.CancelledError:
                queue.done(key)
                raise
            except Exception as exc:
                delay = queue.add_rate_limited(key)
                log.warning(
                    "reconcile failed, retrying",
                    extra={
                        "queue": queue.name,
                        "key": str(key),
                        "retry_in": delay,
                        "error": repr(exc),
                    },
                )
            else:
                queue.forget(key)
            queue.done(key)

    tasks = [asyncio.create_task(worker(), name=f"{queue.name}-worker-{i}") for i in range(workers)]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
