"""The allocator's request responder on a real NATS server: a request it cannot take gets an
error reply naming the problem and is kept as a dead letter with the same reason (both used to
be missing: only the reply said it); a good request after them is answered."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator

import msgspec
import pytest
from neuron_dra_common.bus import ALLOCATOR_SUBJECT, Bus, RpcError, request
from neuron_dra_common.bus.rpc import ERROR_HEADER
from neuron_dra_common.events import (
    AllocationDecided,
    AllocationRequested,
    ObjectRef,
    decode,
    encode,
)
from neuron_dra_topology_allocator.allocator import Allocator
from neuron_dra_topology_allocator.main import allocation_responder
from neuron_dra_topology_allocator.projection import Projection

from tests.contracts.fuzz import MUTATIONS, fuzz_count, fuzz_seed, mutate
from tests.contracts.malformed import CONTRACT_LIMITS
from tests.contracts.support import dead_letters, heartbeat
from tests.fixtures.nats import NatsServer

RESPONDER = "topology-allocator-rpc"


def requested(uid: str = "uid-1") -> AllocationRequested:
    return AllocationRequested(
        request_id="r1",
        workload=ObjectRef(namespace="default", name="train", uid=uid),
        topology_size=4,
    )


@pytest.fixture
async def bus(nats_server: NatsServer) -> AsyncIterator[Bus]:
    bus = await Bus.connect([nats_server.url], name="rpc-test", limits=CONTRACT_LIMITS)
    await bus.reconcile()
    try:
        yield bus
    finally:
        await bus.close()


@pytest.fixture
async def projection(bus: Bus) -> AsyncIterator[Projection]:
    projection = Projection()
    projection.serving = True
    allocator = Allocator(projection, sink=bus.publisher(source="/test"))
    responder = allocation_responder(bus, allocator, subject=ALLOCATOR_SUBJECT)
    await responder.start()
    try:
        yield projection
    finally:
        await responder.stop()


async def error_reply(bus: Bus, payload: bytes) -> str:
    reply = await bus.nc.request(ALLOCATOR_SUBJECT, payload, timeout=5)
    return (reply.headers or {}).get(ERROR_HEADER, "")


async def test_each_refused_request_is_an_error_reply_and_one_dead_letter(
    bus: Bus, projection: Projection
) -> None:
    padded = msgspec.json.decode(encode(requested()))
    padded["padding"] = "x" * CONTRACT_LIMITS.max_message_bytes
    cases = [
        (b"\xff\xfe not an event", "decode", "not JSON"),
        (
            encode(heartbeat("n1")),
            "refused",
            f"message on {ALLOCATOR_SUBJECT}: node.heartbeat.v1 is not one of "
            "allocation.requested.v1, allocation.released.v1",
        ),
        (msgspec.json.encode(padded), "refused", "over the limit of 65536 bytes"),
        (
            encode(requested(uid="")),
            "permanent",
            "NeuronUltraServerWorkload default/train: metadata.uid is empty",
        ),
    ]
    for payload, _, reason in cases * 2:
        assert reason in await error_reply(bus, payload)
    records = await dead_letters(bus, at_least=len(cases) * 2)
    assert len(records) == len(cases) * 2
    for (payload, kind, reason), record in zip(cases * 2, records, strict=True):
        assert (record.consumer, record.subject, record.payload) == (
            RESPONDER,
            ALLOCATOR_SUBJECT,
            payload,
        )
        assert record.kind == kind
        assert reason in record.reason
    answer = await request(bus, ALLOCATOR_SUBJECT, requested(), wait=5)
    assert isinstance(answer, AllocationDecided)
    assert not answer.granted


async def test_a_responder_still_starting_answers_retry_without_a_dead_letter(
    bus: Bus, projection: Projection
) -> None:
    projection.serving = False
    with pytest.raises(RpcError, match="still reading the fleet"):
        await request(bus, ALLOCATOR_SUBJECT, requested(), wait=5)
    # Requests are handled one at a time: once the next one's dead letter is stored, a dead
    # letter of the first would be too.
    assert "not JSON" in await error_reply(bus, b"not an event")
    [record] = await dead_letters(bus)
    assert record.payload == b"not an event"


async def test_fuzzed_requests_get_an_error_and_a_dead_letter_exactly_when_malformed(
    bus: Bus, projection: Projection
) -> None:
    # A seeded mix (NEURON_DRA_FUZZ_MESSAGES of them) of good requests and requests spoiled
    # as the consumer tests spoil events, plus other events and oversized ones: every good
    # one is decided, every malformed one is an error reply naming what is wrong and one
    # dead letter, and the responder answers the next one.
    seed = fuzz_seed()
    rng = random.Random(seed)
    # payload, whether it is malformed, a word its error must name
    sent: list[tuple[bytes, bool, str]] = []
    for index in range(fuzz_count(120)):
        good = requested(uid=f"uid-{index}")
        roll = rng.random()
        if roll < 0.4:
            sent.append((encode(good), False, ""))
        elif roll < 0.85:
            payload, word = mutate(good, rng.choice(MUTATIONS), rng)
            sent.append((payload, True, word))
        elif roll < 0.95:
            sent.append((encode(heartbeat(f"n{index}")), True, "is not one of"))
        else:
            padded = msgspec.json.decode(encode(good))
            padded["padding"] = "x" * CONTRACT_LIMITS.max_message_bytes
            sent.append((msgspec.json.encode(padded), True, "over the limit"))
    for payload, malformed, word in sent:
        reply = await bus.nc.request(ALLOCATOR_SUBJECT, payload, timeout=5)
        error = (reply.headers or {}).get(ERROR_HEADER, "")
        if malformed:
            assert error, (seed, payload[:200])
            assert word in error, (seed, payload[:200], word, error)
        else:
            assert not error, (seed, error)
            assert isinstance(decode(reply.data), AllocationDecided)
    spoiled = [payload for payload, malformed, _ in sent if malformed]
    records = await dead_letters(bus, at_least=len(spoiled))
    assert len(records) == len(spoiled), f"replay with NEURON_DRA_FUZZ_SEED={seed}"
    assert sorted(r.payload for r in records) == sorted(spoiled)
    assert all(r.kind in ("decode", "refused") for r in records), [r.reason for r in records]
    answer = await request(bus, ALLOCATOR_SUBJECT, requested(uid="after"), wait=5)
    assert isinstance(answer, AllocationDecided)
