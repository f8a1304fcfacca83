"""The dead-letter alert: firing while messages keep landing in ``NEURON_DEADLETTER``.

Checked by the stream's last sequence every few seconds (no consumer: nothing is taken from
the dead letter, which is for people). The alert fires when the sequence rose since the last
check and resolves after a quiet spell. Its recorded state carries the sequence it saw, so a
restart neither repeats an old rise nor misses one that happened while it was down.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from neuron_dra_alerts.engine import Alerter
from neuron_dra_alerts.rules import DEAD_LETTERS, Desired, dead_letters_alert

__all__ = ["DeadLetterWatch"]


class DeadLetterWatch:
    """One check per :meth:`check`; ``last_sequence`` reads the stream's last sequence.

    The alert's own sequence space is ``2 * seen`` for a rise and ``2 * seen + 1`` for the
    resolution after it, so each change is newer than the one before.
    """

    def __init__(
        self,
        alerter: Alerter,
        *,
        stream: str,
        last_sequence: Callable[[], Awaitable[int]],
        quiet_seconds: float,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._alerter = alerter
        self._stream = stream
        self._last_sequence = last_sequence
        self._quiet = quiet_seconds
        self._clock = monotonic
        self._seen: int | None = None
        self._last_rise = 0.0

    async def check(self) -> None:
        last = await self._last_sequence()
        current = self._alerter.state.get(DEAD_LETTERS)
        if self._seen is None:
            # The first check: the recorded alert knows what was seen before; without one,
            # what is already there predates this service and is not news.
            self._seen = current.cause_sequence // 2 if current is not None else last
            self._last_rise = self._clock()
        if last > self._seen:
            count = last - self._seen
            self._seen = last
            self._last_rise = self._clock()
            await self._alerter.apply(
                dead_letters_alert(count=count, stream=self._stream),
                sequence=2 * last,
                cause=f"{self._stream}:{last}",
            )
            return
        firing = current is not None and current.status == "firing"
        if firing and self._clock() - self._last_rise >= self._quiet:
            await self._alerter.apply(
                Desired(key=DEAD_LETTERS, alertname=DEAD_LETTERS, status="resolved"),
                sequence=2 * self._seen + 1,
                cause=f"{self._stream}:{self._seen}:quiet",
            )
