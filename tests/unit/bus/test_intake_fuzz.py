"""Fuzzing the one check every consumer runs (``admit``), on every subject the product has.

Whatever arrives, ``admit`` either returns an event that belongs on the subject or raises
``Refused`` with a dead-letter kind and a reason naming what is wrong; nothing else escapes
(anything else would crash a projection's task or leave a message unacked forever).
"""

from __future__ import annotations

import random
import re
import types
import typing
from typing import Any, get_args

import msgspec
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from neuron_dra_common.bus import IntakeLimits, Refused, admit
from neuron_dra_common.bus.deadletter import DeadLetterKind
from neuron_dra_common.bus.rpc import ALLOCATOR_SUBJECT
from neuron_dra_common.events import (
    EVENT_TYPES,
    AllocationReleased,
    AllocationRequested,
    AnyEvent,
    Event,
    encode,
)

from tests.contracts.fuzz import MUTATIONS, SAMPLES, fuzzed_inputs, mutate

LIMITS = IntakeLimits(max_message_bytes=64 * 1024, max_inventory_devices=64)
#: Node names as Kubernetes makes them (DNS-1123 subdomains): the only ones an event may carry.
NODE_NAMES = st.from_regex(
    r"[a-z0-9]([-a-z0-9]{0,6}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,6}[a-z0-9])?){0,2}",
    fullmatch=True,
)
KINDS = set(get_args(DeadLetterKind))
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def strategy_for(hint: Any) -> st.SearchStrategy[Any]:
    """Values of ``hint``, building msgspec Structs field by field.

    ``st.from_type`` reads defaults from the signature, where msgspec shows a
    ``default_factory`` as its factory object, and passes that object on as a value.
    """
    origin, args = typing.get_origin(hint), get_args(hint)
    if isinstance(hint, type) and issubclass(hint, msgspec.Struct):
        hints = typing.get_type_hints(hint)
        fields = {f.name: strategy_for(hints[f.name]) for f in msgspec.structs.fields(hint)}
        if "node" in fields:
            fields["node"] = NODE_NAMES
        if "nodes" in fields:
            fields["nodes"] = st.lists(NODE_NAMES, max_size=3).map(tuple)
        return st.builds(hint, **fields)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(strategy_for(a) for a in args))
    if origin is typing.Literal:
        return st.sampled_from(args)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return st.lists(strategy_for(args[0]), max_size=3).map(tuple)
        return st.tuples(*(strategy_for(a) for a in args))
    if origin is dict:
        return st.dictionaries(strategy_for(args[0]), strategy_for(args[1]), max_size=3)
    if hint is float:
        return st.floats(allow_nan=False, allow_infinity=False)
    if hint is str:
        return st.text(max_size=24)
    return st.from_type(hint)


def _subject_of(event: Event) -> str | None:
    try:
        return event.subject
    except ValueError:
        return None


#: Any event of any type, as a writer could build it (names may be empty or odd).
any_event: st.SearchStrategy[Event] = st.one_of(
    *(strategy_for(cls) for cls in EVENT_TYPES.values())
)
#: Events a writer can publish: each has a subject.
publishable = any_event.filter(lambda e: _subject_of(e) is not None)
#: Every kind of subject the product publishes on, plus the allocator's request subject.
subjects = st.one_of(publishable.map(lambda e: e.subject), st.just(ALLOCATOR_SUBJECT))


def outcome(payload: bytes, subject: str, **kw: Any) -> AnyEvent | Refused:
    """What ``admit`` says; a refusal is checked to be one a dead letter can carry."""
    result: AnyEvent | Refused
    try:
        result = admit(payload, subject=subject, limits=LIMITS, **kw)
    except Refused as refused:
        result = refused
    if isinstance(result, Refused):
        assert result.kind in KINDS
        assert str(result).strip(), "a refusal without a reason"
    return result


@FUZZ
@given(payload=st.binary(max_size=2048), subject=subjects)
def test_arbitrary_bytes_are_admitted_only_as_an_event_of_their_subject(
    payload: bytes, subject: str
) -> None:
    result = outcome(payload, subject)
    if not isinstance(result, Refused):
        assert result.subject == subject


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@st.composite
def event_shaped(draw: st.DrawFn) -> dict[str, Any]:
    """A JSON object with a known ``type`` and any mix of its own and other fields."""
    tag = draw(st.sampled_from(sorted(EVENT_TYPES)))
    names = [f.encode_name for f in msgspec.structs.fields(EVENT_TYPES[tag])]
    keys = st.one_of(st.sampled_from(names), st.text(max_size=8))
    body = draw(st.dictionaries(keys, json_values, max_size=len(names) + 2))
    return {**body, "type": tag}


@FUZZ
@given(body=event_shaped(), subject=subjects)
def test_event_shaped_json_is_refused_naming_the_field_or_admitted_on_its_subject(
    body: dict[str, Any], subject: str
) -> None:
    result = outcome(msgspec.json.encode(body), subject)
    if isinstance(result, Refused):
        if result.kind == "decode":
            assert "$." in str(result) or "missing required field" in str(result), str(result)
    else:
        assert result.subject == subject


@FUZZ
@given(event=publishable)
def test_every_publishable_event_is_admitted_on_its_own_subject_as_it_was_sent(
    event: Event,
) -> None:
    payload = encode(event)
    assume(len(payload) <= LIMITS.max_message_bytes)
    devices = getattr(getattr(event, "hardware", None), "devices", ())
    assume(len(devices) <= LIMITS.max_inventory_devices)
    assert admit(payload, subject=event.subject, limits=LIMITS) == event


@FUZZ
@given(event=publishable, name=st.text(max_size=24), subject=subjects)
def test_an_event_whose_node_is_no_node_name_is_not_decoded(
    event: Event, name: str, subject: str
) -> None:
    """Only DNS-1123 subdomains are node names: no two of them share a subject token."""
    assume(hasattr(event, "node"))
    assume(
        not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", name)
    )
    refused = outcome(encode(msgspec.structs.replace(event, node=name)), subject)
    assert isinstance(refused, Refused)
    assert refused.kind == "decode"
    assert "`$.node`" in str(refused), str(refused)
    assert "is not a node name" in str(refused), str(refused)


@FUZZ
@given(event=any_event.filter(lambda e: _subject_of(e) is None), subject=subjects)
def test_an_event_without_a_subject_is_refused_naming_why(event: Event, subject: str) -> None:
    refused = outcome(encode(event), subject)
    assert isinstance(refused, Refused)
    assert refused.kind == "refused"
    assert "empty" in str(refused) or "is not one of" in str(refused), str(refused)


@FUZZ
@given(event=publishable, kind=st.sampled_from(MUTATIONS), seed=st.integers(0, 2**32 - 1))
def test_a_spoiled_event_is_refused_naming_what_was_spoiled(
    event: Event, kind: str, seed: int
) -> None:
    payload, word = mutate(event, kind, random.Random(seed))
    refused = outcome(payload, event.subject)
    assert isinstance(refused, Refused), f"{kind}: {payload!r} was admitted"
    assert refused.kind == "decode", (kind, str(refused))
    assert word in str(refused), (kind, word, str(refused))


@FUZZ
@given(event=publishable)
def test_the_allocator_takes_requests_and_releases_only(event: Event) -> None:
    accepts = (AllocationRequested, AllocationReleased)
    result = outcome(encode(event), ALLOCATOR_SUBJECT, accepts=accepts)
    if isinstance(event, accepts):
        assert result == event
    else:
        assert isinstance(result, Refused)
        assert event.event_type() in str(result)


@pytest.mark.parametrize("tag", sorted(SAMPLES))
def test_a_seeded_mix_is_refused_exactly_where_it_is_malformed(tag: str) -> None:
    # The mix the integration tests publish to real consumers, for every event type: refused
    # exactly when malformed, each reason naming its word; the good ones admitted as sent.
    mix = fuzzed_inputs(SAMPLES[tag], count=400, seed=sorted(SAMPLES).index(tag), limits=LIMITS)
    for message in mix:
        result = outcome(message.payload, message.subject)
        if message.malformed:
            assert isinstance(result, Refused), f"{message.what}: {message.payload!r}"
            assert message.word in str(result), (message.what, message.word, str(result))
        else:
            assert result == message.good, message.what
