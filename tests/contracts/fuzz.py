"""Fuzzed messages for a consumer: a seeded mix of malformed and good ones on its subjects.

Each malformed message is malformed by construction (not by asking the code under test), so
"dead letters = malformed" is checked against an independent count:

- ``garbage``: random bytes that cannot open a JSON object (first byte is neither ``{`` nor
  blank), so they are either not JSON or JSON that is not an event;
- ``truncated``: a proper prefix of a good event's JSON (a cut object never parses);
- ``unknown type``: a good event whose ``type`` tag names no event;
- ``missing field``: a good event without one of its required fields;
- ``wrong field type``: a good event with one field's value of another JSON type;
- ``wrong type``, ``oversized``, ``subject/body mismatch``, ``too many devices``: the cases of
  :mod:`tests.contracts.malformed`.

Good messages are the consumer's own sample events, some with an extra field a newer writer
might add (ignored on decode). Every message lands on the subject of a distinct sample, so
streams that keep one message per subject keep them all.

>>> messages = fuzzed_inputs(sample, count=200, seed=7, first=1000)
>>> sum(m.malformed for m in messages)
"""

from __future__ import annotations

import collections
import os
import random
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

import msgspec
from neuron_dra_common.bus import DeadLetterRecord, IntakeLimits
from neuron_dra_common.events import (
    EVENT_TYPES,
    AlertStateChanged,
    AllocationDecided,
    AllocationReleased,
    AllocationRequested,
    ClaimPrepared,
    ClaimUnprepared,
    DeviceHealthChanged,
    DeviceTaintChanged,
    Event,
    NodeHeartbeat,
    NodeInventory,
    NodeLost,
    NodeRecovered,
    ObjectRef,
    WorkloadStateChanged,
    encode,
)
from neuron_dra_common.hardware.model import NeuronDevice, NodeHardware

from tests.contracts.malformed import CONTRACT_LIMITS, malformed_inputs

__all__ = [
    "MUTATIONS",
    "SAMPLES",
    "FuzzRun",
    "Fuzzed",
    "check_fuzzed_dead_letters",
    "fuzz_count",
    "fuzz_run",
    "fuzz_seed",
    "fuzzed_inputs",
    "mutate",
    "patience",
]


def fuzz_count(default: int) -> int:
    """How many fuzzed messages a test sends: ``NEURON_DRA_FUZZ_MESSAGES`` or ``default``."""
    return int(os.environ.get("NEURON_DRA_FUZZ_MESSAGES", default))


def fuzz_seed() -> int:
    """The seed of the mix (``NEURON_DRA_FUZZ_SEED``, default 15): a failure names it."""
    return int(os.environ.get("NEURON_DRA_FUZZ_SEED", 15))


def patience(messages: int) -> float:
    """Seconds to wait for ``messages`` to be handled: 10, more for a large fuzz run."""
    return max(10.0, messages / 20)


class FuzzRun(NamedTuple):
    """What a contract's fuzz test sends: the seeded mix, then ``last`` (a good event whose
    effect shows the consumer kept going)."""

    seed: int
    messages: list[Fuzzed]
    last: Event
    malformed: int


def fuzz_run(sample: Callable[[int], Event], good: Sequence[int] | None) -> FuzzRun:
    """The mix of ``NEURON_DRA_FUZZ_MESSAGES`` (default 120) messages built from ``sample``,
    good ones only at the indices ``good`` names (``None``: any), and the last good event."""
    seed = fuzz_seed()
    indices = list(good) if good is not None else None
    last = sample(indices.pop() if indices else 999)
    messages = fuzzed_inputs(sample, count=fuzz_count(120), seed=seed, first=1000, good=indices)
    return FuzzRun(seed, messages, last, sum(m.malformed for m in messages))


class Fuzzed(NamedTuple):
    """One fuzzed message: where it goes, its bytes, and whether a consumer must refuse it.

    ``good`` is the event a consumer must apply (``None`` for a malformed message); ``word``
    is a word the refusal's reason must contain (the field, tag or limit that is wrong).
    """

    what: str
    subject: str
    payload: bytes
    malformed: bool
    good: Event | None = None
    word: str = ""

    @property
    def checkable(self) -> bool:
        """A good message whose effect is its sample's (one with a newer field may be kept
        as sent, with that field, by a consumer that stores payloads)."""
        return self.good is not None and self.what == "good"


def _required(event: Event) -> list[str]:
    """The JSON names of the fields ``event``'s type cannot do without."""
    return [
        f.encode_name
        for f in msgspec.structs.fields(type(event))
        if f.default is msgspec.NODEFAULT and f.default_factory is msgspec.NODEFAULT
    ]


def _other_json_type(value: Any, rng: random.Random) -> Any:
    """A JSON value of another type than ``value`` (never one msgspec would coerce)."""
    if isinstance(value, str):
        return rng.choice([rng.randint(-5, 10**6), [value], {"v": value}, True])
    if isinstance(value, bool):
        return rng.choice(["yes", 1.5, [value]])
    if isinstance(value, int | float):
        return rng.choice([str(value), [value], {"v": value}])
    if isinstance(value, list | dict):
        return rng.choice(["not a collection", 42])
    return [["not", "this"]]  # null: no field of an event is a list of lists


def mutate(event: Event, kind: str, rng: random.Random) -> tuple[bytes, str]:
    """``event``'s JSON spoiled by ``kind`` (one of :data:`MUTATIONS`), and the word its
    refusal must name."""
    raw = encode(event)
    if kind == "garbage":
        first = rng.choice([b for b in range(256) if b not in b"{ \t\r\n"])
        tail = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 64)))
        return bytes([first]) + tail, ""
    if kind == "truncated":
        return raw[: rng.randrange(1, len(raw))], "not JSON"
    body = msgspec.json.decode(raw)
    if kind == "unknown type":
        tag = f"{rng.choice(['node', 'device', 'nope'])}.fuzzed{rng.randrange(10**6)}.v9"
        assert tag not in EVENT_TYPES
        body["type"] = tag
        return msgspec.json.encode(body), tag
    if kind == "missing field":
        field = rng.choice(_required(event))
        del body[field]
        return msgspec.json.encode(body), field
    if kind == "wrong field type":
        field = rng.choice([k for k in body if k != "type"])
        body[field] = _other_json_type(body[field], rng)
        return msgspec.json.encode(body), field
    raise ValueError(f"mutation {kind!r} is not one of {', '.join(MUTATIONS)}")


#: The mutations :func:`mutate` knows.
MUTATIONS: tuple[str, ...] = (
    "garbage",
    "truncated",
    "unknown type",
    "missing field",
    "wrong field type",
)


def fuzzed_inputs(
    sample: Callable[[int], Event],
    *,
    count: int,
    seed: int,
    first: int = 1000,
    limits: IntakeLimits = CONTRACT_LIMITS,
    malformed_share: float = 0.6,
    good: Sequence[int] | None = None,
) -> list[Fuzzed]:
    """``count`` messages for a consumer whose good events ``sample(i)`` builds, about
    ``malformed_share`` of them malformed, reproducible from ``seed``.

    ``good`` limits the good messages to ``sample(i)`` for those ``i``, each sent once, for
    a consumer whose samples have an effect only for a few indices; the rest is malformed.
    """
    rng = random.Random(seed)
    out: list[Fuzzed] = []
    index = first
    goods = list(good) if good is not None else None
    while len(out) < count:
        base = sample(index)
        if rng.random() >= malformed_share and goods != []:
            if goods is not None:
                base = sample(goods.pop(0))
            payload = encode(base)
            what = "good"
            if rng.random() < 0.3:
                extended = msgspec.json.decode(payload)
                extended[f"addedLater{rng.randrange(100)}"] = {"any": ["value", 1]}
                payload, what = msgspec.json.encode(extended), "good, with a newer field"
            out.append(Fuzzed(what, base.subject, payload, False, base))
            index += goods is None
        elif rng.random() < 0.7:
            kind = rng.choice(MUTATIONS)
            payload, word = mutate(base, kind, rng)
            out.append(Fuzzed(kind, base.subject, payload, True, word=word))
            index += 1
        else:
            # The contract's cases take five samples from ``index`` on (four, or five for
            # inventories); one of them, picked at random, joins the mix.
            cases = malformed_inputs(sample, first=index, limits=limits)
            case = rng.choice(cases)
            out.append(Fuzzed(case.what, case.subject, case.payload, True, word=case.reason))
            index += 5
    return out


_AT = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


def _ref(index: int) -> ObjectRef:
    return ObjectRef(namespace="ml", name=f"w{index}", uid=f"uid-{index}")


#: A distinct good event of each type for ``index`` 0, 1, 2, ... (each on its own subject).
SAMPLES: dict[str, Callable[[int], Event]] = {
    NodeInventory.event_type(): lambda i: NodeInventory(
        node=f"ip-10-0-{i // 250}-{i % 250}.ec2.internal",
        boot_id="boot",
        generation=i,
        hardware=NodeHardware(
            instance_type="trn2.48xlarge", devices=tuple(NeuronDevice(index=d) for d in range(16))
        ),
    ),
    NodeHeartbeat.event_type(): lambda i: NodeHeartbeat(
        node=f"node-{i}", boot_id="boot", sequence=i, sent_at=_AT
    ),
    DeviceHealthChanged.event_type(): lambda i: DeviceHealthChanged(
        node=f"node-{i}", device=f"neurondevice{i % 16}", health="Unhealthy", reason=f"r{i}"
    ),
    DeviceTaintChanged.event_type(): lambda i: DeviceTaintChanged(
        node=f"node-{i}", device=f"neurondevice{i % 16}", reason=f"r{i}"
    ),
    NodeLost.event_type(): lambda i: NodeLost(node=f"node-{i}", detected_at=_AT),
    NodeRecovered.event_type(): lambda i: NodeRecovered(node=f"node-{i}", detected_at=_AT),
    AllocationRequested.event_type(): lambda i: AllocationRequested(
        request_id=f"r{i}", workload=_ref(i), topology_size=4
    ),
    AllocationDecided.event_type(): lambda i: AllocationDecided(
        request_id=f"r{i}", workload=_ref(i), granted=False, reason="no capacity"
    ),
    AllocationReleased.event_type(): lambda i: AllocationReleased(
        request_id=f"r{i}", workload=_ref(i)
    ),
    ClaimPrepared.event_type(): lambda i: ClaimPrepared(
        node=f"node-{i}", claim=_ref(i), devices=("neurondevice0",)
    ),
    ClaimUnprepared.event_type(): lambda i: ClaimUnprepared(node=f"node-{i}", claim=_ref(i)),
    WorkloadStateChanged.event_type(): lambda i: WorkloadStateChanged(
        workload=_ref(i), state="Running"
    ),
    AlertStateChanged.event_type(): lambda i: AlertStateChanged(
        key=f"NeuronDeviceUnhealthy/node-{i}",
        alertname="NeuronDeviceUnhealthy",
        status="firing",
        labels={"node": f"node-{i}"},
        starts_at=_AT,
    ),
}
assert set(SAMPLES) == set(EVENT_TYPES), "a sample for every event type"


def check_fuzzed_dead_letters(
    records: Sequence[DeadLetterRecord], messages: Sequence[Fuzzed], *, consumer: str, seed: int
) -> None:
    """One dead letter of ``consumer`` per malformed message, none for a good one, each
    reason naming what was wrong."""
    mine = [r for r in records if r.consumer == consumer]
    malformed = [m for m in messages if m.malformed]
    replay = f"(replay with NEURON_DRA_FUZZ_SEED={seed})"
    assert len(mine) == len(malformed), (
        f"{consumer}: {len(malformed)} malformed messages, {len(mine)} dead letters {replay}"
    )
    stored = collections.Counter((r.subject, r.payload) for r in mine)
    sent = collections.Counter((m.subject, m.payload) for m in malformed)
    assert stored == sent, f"{consumer}: dead letters are not the malformed messages {replay}"
    reasons = collections.defaultdict(list)
    for record in mine:
        reasons[record.payload].append(record)
    for message in malformed:
        record = reasons[message.payload].pop()
        assert record.kind in ("decode", "refused"), (message.what, record.kind, replay)
        assert message.word in record.reason, (message.what, message.word, record.reason, replay)
