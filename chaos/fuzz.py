"""Fuzzed messages against the running stack's own consumers (goal R3).

Malformed messages, malformed by construction (``tests.contracts.fuzz``: garbage, cut JSON,
unknown type tags, missing or mistyped fields, a valid event of another type, a body about
another node than its subject, an inventory with too many devices), go to the subjects the
stack's durable consumers read, about nodes and objects the stack does not have. Each must
become exactly one dead letter of every durable consumer whose filter takes its subject, and
no process of the stack may die. Messages over NATS's own payload limit never reach a
consumer (the server refuses them), so the oversized case is left out.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from neuron_dra_common.bus import Bus, BusCredentials, IntakeLimits, read_dead_letter
from neuron_dra_common.bus.declarations import DEADLETTER

from tests.contracts.fuzz import SAMPLES, Fuzzed, fuzzed_inputs

__all__ = ["FuzzResult", "fuzz_stack", "subject_matches"]

#: Where the samples' indices start: far from the indices any test uses.
FIRST_INDEX = 5_000_000


class FuzzResult(NamedTuple):
    sent: int
    #: (consumer, message) pairs that must each be one dead letter.
    expected: int
    #: Of those, how many are.
    dead_lettered: int
    #: Dead letters that are a second one of a consumer for one message.
    duplicates: int
    #: The first few pairs without their dead letter, in words.
    missing: tuple[str, ...]
    #: The durable consumers the messages went to.
    consumers: tuple[str, ...]


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` is one token, a final ``>`` one or more."""
    want, got = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(got) > i
        if i >= len(got) or (token != "*" and token != got[i]):
            return False
    return len(want) == len(got)


async def _durables(bus: Bus) -> dict[str, tuple[str, ...]]:
    """Every durable consumer of the stack's streams (but the dead letters'): its filters."""
    out: dict[str, tuple[str, ...]] = {}
    for stream in await bus.js.streams_info():
        name = stream.config.name
        if name is None or name == DEADLETTER.name:
            continue
        for info in await bus.js.consumers_info(name):
            config = info.config
            if not config.durable_name:
                continue
            filters = tuple(config.filter_subjects or ())
            if config.filter_subject:
                filters += (config.filter_subject,)
            out[config.durable_name] = filters or tuple(stream.config.subjects or ())
    return out


def _messages(count: int, seed: int, durables: Mapping[str, tuple[str, ...]]) -> list[Fuzzed]:
    """``count`` malformed messages, spread over the event types some durable consumer reads."""
    types = [
        name
        for name, sample in sorted(SAMPLES.items())
        if any(
            subject_matches(f, sample(FIRST_INDEX).subject)
            for filters in durables.values()
            for f in filters
        )
    ]
    if not types:
        return []
    share, rest = divmod(count, len(types))
    out: list[Fuzzed] = []
    for i, name in enumerate(types):
        k = share + (i < rest)
        if not k:
            continue
        # A few more than due, for the oversized ones left out.
        mix = fuzzed_inputs(
            SAMPLES[name],
            count=k + k // 4 + 5,
            seed=seed + i,
            first=FIRST_INDEX + i * 10 * max(count, 1),
            limits=IntakeLimits(),
            malformed_share=1.0,
        )
        out += [m for m in mix if m.what != "oversized"][:k]
    return out


class _DeadLetters:
    """The dead-letter stream from a sequence on, read as it grows: (consumer, subject,
    payload) -> how many."""

    def __init__(self, bus: Bus, first: int) -> None:
        self._bus = bus
        self._next = first
        self.counts: collections.Counter[tuple[str, str, bytes]] = collections.Counter()

    async def read(self) -> None:
        info = await self._bus.js.stream_info(DEADLETTER.name)
        for seq in range(max(self._next, info.state.first_seq), info.state.last_seq + 1):
            raw = await self._bus.js.get_msg(DEADLETTER.name, seq)
            record = read_dead_letter(raw.data or b"", raw.headers)
            self.counts[(record.consumer, record.subject, record.payload)] += 1
        self._next = max(self._next, info.state.last_seq + 1)


async def fuzz_stack(
    nats_url: str, *, count: int, seed: int, credentials: BusCredentials
) -> FuzzResult:
    """Send ``count`` fuzzed messages to the stack at ``nats_url`` and count its dead letters."""
    bus = await Bus.connect([nats_url], name="chaos-fuzz", credentials=credentials)
    try:
        durables = await _durables(bus)
        messages = _messages(count, seed, durables)
        wanted = {
            (consumer, m.subject, m.payload)
            for m in messages
            for consumer, filters in durables.items()
            if any(subject_matches(f, m.subject) for f in filters)
        }
        letters = _DeadLetters(bus, (await bus.js.stream_info(DEADLETTER.name)).state.last_seq + 1)
        for m in messages:
            await bus.js.publish(m.subject, m.payload)
        deadline = time.monotonic() + 30 + count / 20
        while True:
            await letters.read()
            if all(letters.counts[key] for key in wanted) or time.monotonic() > deadline:
                break
            await asyncio.sleep(1.0)
        await asyncio.sleep(2.0)  # anything doubled arrives after the first
        await letters.read()
        got = letters.counts
    finally:
        await bus.close()
    missing = sorted(key for key in wanted if got[key] == 0)
    return FuzzResult(
        sent=len(messages),
        expected=len(wanted),
        dead_lettered=len(wanted) - len(missing),
        duplicates=sum(n - 1 for n in got.values() if n > 1),
        missing=tuple(f"{c}: {s} {p[:40]!r}" for c, s, p in missing[:5]),
        consumers=tuple(sorted(durables)),
    )


def crashed(
    before: dict[str, int], after: Sequence[tuple[str, int]], down: Sequence[str]
) -> list[str]:
    """The components that died meanwhile: down now, or running under another process id."""
    now = dict(after)
    out = [f"{name} down" for name in down]
    out += [f"{name} restarted" for name, pid in before.items() if now.get(name, pid) != pid]
    return out
