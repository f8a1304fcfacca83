"""The contract of a projection reader (a :class:`Follower` a service builds), on real NATS.

A reader rebuilds in-memory state from a stream, so it is never redelivered anything: what it
cannot take must be a dead letter at once, once, however often the stream is read again, and
the reader must go on with the next message. A service's test module subclasses
:class:`ReaderContract`, gives its good events, builds its real reader on fresh state, and says
how often an event was applied::

    class TestAllocatorInventory(ReaderContract):
        def sample_event(self, index: int) -> Event: ...
        def make_reader(self, bus: Bus) -> Follower: ...
        async def effect_count(self, event: Event) -> int: ...
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

import pytest
from neuron_dra_common.bus import Bus, Follower
from neuron_dra_common.events import Event

from tests.contracts.fuzz import check_fuzzed_dead_letters, fuzz_run, patience
from tests.contracts.malformed import CONTRACT_LIMITS, check_dead_letters, malformed_inputs
from tests.contracts.support import dead_letters, wait_until
from tests.fixtures.nats import NatsServer

__all__ = ["ReaderContract"]


class ReaderContract(abc.ABC):
    """Malformed messages to the dead letter with their reason, once; the reader goes on."""

    #: The indices whose samples have an effect, when only a few do (``None``: any index).
    fuzz_good: Sequence[int] | None = None

    @abc.abstractmethod
    def sample_event(self, index: int) -> Event:
        """A distinct event the reader applies, for ``index`` 0, 1, 2, ..."""

    @abc.abstractmethod
    def make_reader(self, bus: Bus) -> Follower:
        """The service's own reader, on fresh state."""

    @abc.abstractmethod
    async def effect_count(self, event: Event) -> int:
        """How many times ``event`` was applied to the state of the last reader made."""

    @pytest.fixture
    async def contract_bus(self, nats_server: NatsServer) -> AsyncIterator[Bus]:
        bus = await Bus.connect([nats_server.url], name="contract-reader", limits=CONTRACT_LIMITS)
        await bus.reconcile()
        try:
            yield bus
        finally:
            await bus.close()

    @contextlib.asynccontextmanager
    async def _following(self, bus: Bus, *, within: float = 10.0) -> AsyncIterator[Follower]:
        reader = self.make_reader(bus)
        task = asyncio.create_task(reader.run(), name=f"reader-{reader.name}")
        try:
            await asyncio.wait_for(reader.wait_caught_up(), within)
            yield reader
        finally:
            reader.stop()
            await asyncio.wait_for(task, 10)

    async def _applied(self, event: Event) -> None:
        deadline = asyncio.get_running_loop().time() + 10
        while await self.effect_count(event) < 1:
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"{event.event_type()}: not applied within 10s")
            await asyncio.sleep(0.02)

    async def test_n_malformed_stored_messages_are_n_dead_letters_and_the_rest_is_applied(
        self, contract_bus: Bus
    ) -> None:
        cases = [
            case
            for round_ in range(3)
            for case in malformed_inputs(self.sample_event, first=100 + 10 * round_)
        ]
        for case in cases:
            await contract_bus.js.publish(case.subject, case.payload)
        good = self.sample_event(1)
        await contract_bus.publisher(source="/contract").publish(good)
        async with self._following(contract_bus) as reader:
            await self._applied(good)
            await dead_letters(contract_bus, at_least=len(cases))
        check_dead_letters(await dead_letters(contract_bus), cases, consumer=reader.name)
        assert await self.effect_count(good) == 1

    async def test_reading_the_stream_again_stores_no_second_dead_letter(
        self, contract_bus: Bus
    ) -> None:
        cases = malformed_inputs(self.sample_event, first=100)
        for case in cases:
            await contract_bus.js.publish(case.subject, case.payload)
        async with self._following(contract_bus):
            await dead_letters(contract_bus, at_least=len(cases))
        # A restart reads everything again; the good event after it shows it read past them.
        good = self.sample_event(2)
        await contract_bus.publisher(source="/contract").publish(good)
        async with self._following(contract_bus) as reader:
            await self._applied(good)
        check_dead_letters(await dead_letters(contract_bus), cases, consumer=reader.name)

    async def test_a_malformed_message_after_catching_up_is_dead_lettered_too(
        self, contract_bus: Bus
    ) -> None:
        cases = malformed_inputs(self.sample_event, first=100)
        good = self.sample_event(3)
        async with self._following(contract_bus) as reader:
            for case in cases:
                await contract_bus.js.publish(case.subject, case.payload)
            await contract_bus.publisher(source="/contract").publish(good)
            await self._applied(good)
            await wait_until(
                lambda: reader.dead_lettered >= len(cases), what="the dead letters of the reader"
            )
        check_dead_letters(await dead_letters(contract_bus), cases, consumer=reader.name)

    async def test_fuzzed_messages_are_dead_letters_exactly_when_malformed_and_it_keeps_going(
        self, contract_bus: Bus
    ) -> None:
        # A seeded mix (NEURON_DRA_FUZZ_MESSAGES of them), half stored before the reader
        # starts (its replay) and half after it caught up (following): dead letters =
        # malformed, every good one applied once, and the reader applies what comes after.
        seed, messages, last, malformed = fuzz_run(self.sample_event, self.fuzz_good)
        half = len(messages) // 2
        for message in messages[:half]:
            await contract_bus.js.publish(message.subject, message.payload)
        async with self._following(contract_bus, within=patience(half)) as reader:
            for message in messages[half:]:
                await contract_bus.js.publish(message.subject, message.payload)
            await contract_bus.publisher(source="/contract").publish(last)
            await self._applied(last)
            await wait_until(
                lambda: reader.dead_lettered >= malformed,
                within=patience(malformed),
                what="the dead letters of the reader",
            )
        check_fuzzed_dead_letters(
            await dead_letters(contract_bus, at_least=malformed),
            messages,
            consumer=reader.name,
            seed=seed,
        )
        for message in messages:
            if message.checkable and message.good is not None:
                assert await self.effect_count(message.good) == 1, message.what
