"""The contract every service that consumes events must keep, run against its real handler.

Besides ack, redelivery and idempotency: every malformed message (see
:mod:`tests.contracts.malformed`) is exactly one dead letter naming what is wrong, and the
consumer goes on with the next good message.

A service's test module subclasses :class:`ConsumerContract`, names its consumer, gives a few
events it handles, builds its real handler, and says how many times an event's effect is
visible. pytest then runs every ``test_*`` here against it::

    class TestSlicePublisherInventory(ConsumerContract):
        spec = consumer("slice-publisher-inventory")

        def sample_event(self, index: int) -> Event: ...
        async def make_handler(self, bus: Bus) -> Handler: ...
        async def effect_count(self, event: Event) -> int: ...
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import AsyncIterator, Sequence

import msgspec
import pytest
from neuron_dra_common.bus import Bus, ConsumerSpec, Delivery, Handler, RunnerOptions
from neuron_dra_common.events import AnyEvent, Event

from tests.contracts.fuzz import check_fuzzed_dead_letters, fuzz_run, patience
from tests.contracts.malformed import CONTRACT_LIMITS, check_dead_letters, malformed_inputs
from tests.contracts.support import dead_letters, running
from tests.fixtures.nats import NatsServer

__all__ = ["ConsumerContract"]


class ConsumerContract(abc.ABC):
    """Ack, redelivery, poison to dead letter with its reason, idempotency."""

    #: The consumer under test (its ack wait is shortened for the tests).
    spec: ConsumerSpec
    #: Runner settings with short pauses; a service may override with its own.
    options = RunnerOptions(backoff=(0.05,), max_attempts=3)
    #: The indices whose samples have an effect, when only a few do (``None``: any index).
    fuzz_good: Sequence[int] | None = None

    @abc.abstractmethod
    def sample_event(self, index: int) -> Event:
        """A distinct event the consumer handles successfully, for ``index`` 0, 1, 2, ..."""

    @abc.abstractmethod
    async def make_handler(self, bus: Bus) -> Handler:
        """The service's real handler, wired to fresh state for this test."""

    @abc.abstractmethod
    async def effect_count(self, event: Event) -> int:
        """How many times ``event``'s effect was applied (1 once handled, never more)."""

    # -- plumbing ------------------------------------------------------------------------------

    @pytest.fixture
    async def contract_bus(self, nats_server: NatsServer) -> AsyncIterator[Bus]:
        bus = await Bus.connect(
            [nats_server.url], name=f"contract-{self.spec.durable}", limits=CONTRACT_LIMITS
        )
        await bus.reconcile()
        try:
            yield bus
        finally:
            await bus.close()

    def _spec(self) -> ConsumerSpec:
        return msgspec.structs.replace(self.spec, ack_wait_seconds=2.0)

    async def _effect(self, event: Event, *, at_least: int = 1) -> None:
        deadline = asyncio.get_running_loop().time() + 10
        while await self.effect_count(event) < at_least:
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"{event.event_type()}: effect not applied within 10s")
            await asyncio.sleep(0.02)

    async def _publish(self, bus: Bus, event: Event) -> None:
        await bus.publisher(source="/contract").publish(event)

    async def _settled(self, bus: Bus) -> None:
        spec = self._spec()

        async def pending() -> int:
            info = await bus.js.consumer_info(spec.stream, spec.durable)
            return int(info.num_ack_pending + info.num_pending)

        deadline = asyncio.get_running_loop().time() + 10
        while await pending():
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"{spec.durable}: messages still unacked after 10s")
            await asyncio.sleep(0.05)

    # -- the contract --------------------------------------------------------------------------

    async def test_handled_message_is_applied_and_acked(self, contract_bus: Bus) -> None:
        handler = await self.make_handler(contract_bus)
        event = self.sample_event(0)
        await self._publish(contract_bus, event)
        async with running(contract_bus.runner(self._spec(), handler, options=self.options)):
            await self._effect(event)
            await self._settled(contract_bus)
        assert await self.effect_count(event) == 1

    async def test_failed_handling_is_redelivered(self, contract_bus: Bus) -> None:
        real = await self.make_handler(contract_bus)
        attempts: list[int] = []

        async def fails_first(event: AnyEvent, delivery: Delivery) -> None:
            attempts.append(delivery.deliveries)
            if delivery.deliveries == 1:
                raise ConnectionError("dependency unavailable")
            await real(event, delivery)

        event = self.sample_event(0)
        await self._publish(contract_bus, event)
        async with running(contract_bus.runner(self._spec(), fails_first, options=self.options)):
            await self._effect(event)
            await self._settled(contract_bus)
        assert attempts == [1, 2]
        assert await self.effect_count(event) == 1

    async def test_poison_message_goes_to_dead_letter_with_reason(self, contract_bus: Bus) -> None:
        handler = await self.make_handler(contract_bus)
        good = self.sample_event(1)
        poison = b'{"type":"no.such.event.v1"}'
        await contract_bus.js.publish(
            self.sample_event(0).subject, poison, headers={"Nats-Msg-Id": "poison"}
        )
        await self._publish(contract_bus, good)
        async with running(contract_bus.runner(self._spec(), handler, options=self.options)):
            [record] = await dead_letters(contract_bus)
            await self._effect(good)
            await self._settled(contract_bus)
        assert record.payload == poison
        assert record.kind == "decode"
        assert "no.such.event.v1" in record.reason
        assert record.consumer == self.spec.durable

    async def test_redelivery_after_the_effect_is_not_applied_twice(
        self, contract_bus: Bus
    ) -> None:
        real = await self.make_handler(contract_bus)

        async def crashes_before_ack(event: AnyEvent, delivery: Delivery) -> None:
            # The effect happens, then the process "dies" before acking: the message comes
            # back, and the handler must recognise it.
            await real(event, delivery)
            if delivery.deliveries == 1:
                raise RuntimeError("lost before ack")

        event = self.sample_event(2)
        await self._publish(contract_bus, event)
        runner = contract_bus.runner(self._spec(), crashes_before_ack, options=self.options)
        async with running(runner):
            await self._effect(event)
            await self._settled(contract_bus)
        assert await self.effect_count(event) == 1

    async def test_a_restarted_consumer_resumes_where_it_stopped(self, contract_bus: Bus) -> None:
        handler = await self.make_handler(contract_bus)
        first, second = self.sample_event(0), self.sample_event(1)
        await self._publish(contract_bus, first)
        async with running(contract_bus.runner(self._spec(), handler, options=self.options)):
            await self._effect(first)
            await self._settled(contract_bus)
        await self._publish(contract_bus, second)
        async with running(contract_bus.runner(self._spec(), handler, options=self.options)):
            await self._effect(second)
            await self._settled(contract_bus)
        assert (await self.effect_count(first), await self.effect_count(second)) == (1, 1)

    async def test_n_malformed_messages_are_n_dead_letters_and_the_next_good_one_is_handled(
        self, contract_bus: Bus
    ) -> None:
        handler = await self.make_handler(contract_bus)
        cases = [
            case
            for round_ in range(3)
            for case in malformed_inputs(self.sample_event, first=100 + 10 * round_)
        ]
        for case in cases:
            await contract_bus.js.publish(case.subject, case.payload)
        good = self.sample_event(1)
        await self._publish(contract_bus, good)
        async with running(contract_bus.runner(self._spec(), handler, options=self.options)):
            await dead_letters(contract_bus, at_least=len(cases))
            await self._effect(good)
            await self._settled(contract_bus)
        check_dead_letters(await dead_letters(contract_bus), cases, consumer=self.spec.durable)
        assert await self.effect_count(good) == 1

    async def test_fuzzed_messages_are_dead_letters_exactly_when_malformed_and_it_keeps_going(
        self, contract_bus: Bus
    ) -> None:
        # A seeded mix of malformed and good messages (NEURON_DRA_FUZZ_MESSAGES of them):
        # dead letters = malformed, every good one handled once, and the consumer still
        # handles what comes after.
        seed, messages, last, malformed = fuzz_run(self.sample_event, self.fuzz_good)
        handler = await self.make_handler(contract_bus)
        runner = contract_bus.runner(self._spec(), handler, options=self.options)
        async with running(runner):
            for message in messages:
                await contract_bus.js.publish(message.subject, message.payload)
            await self._publish(contract_bus, last)
            await dead_letters(contract_bus, at_least=malformed, within=patience(malformed))
            await self._effect(last)
            await self._settled(contract_bus)
            assert runner.ready, f"{self.spec.durable}: the runner stopped"
        check_fuzzed_dead_letters(
            await dead_letters(contract_bus, at_least=malformed),
            messages,
            consumer=self.spec.durable,
            seed=seed,
        )
        for message in messages:
            if message.checkable and message.good is not None:
                assert await self.effect_count(message.good) == 1, message.what
