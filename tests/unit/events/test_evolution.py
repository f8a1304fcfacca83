"""Events evolve safely: old payloads still decode, no field changes type or disappears.

Golden payloads under ``golden/`` were written by earlier versions and are never rewritten;
``golden/schema.json`` records every field of every event (and nested Struct) as shipped.
Set ``NEURON_DRA_WRITE_GOLDEN=1`` to add files for a new event type or version.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import msgspec
import pytest
from neuron_dra_common.events import EVENT_TYPES, DecodeError, decode, encode

from tests.unit.events.samples import samples

GOLDEN = Path(__file__).parent / "golden"
WRITE = os.environ.get("NEURON_DRA_WRITE_GOLDEN") == "1"


def _describe(t: msgspec.inspect.Type, structs: dict[str, Any]) -> str:
    if isinstance(t, msgspec.inspect.StructType):
        _struct_schema(t, structs)
        return t.cls.__name__
    if isinstance(t, msgspec.inspect.UnionType):
        return " | ".join(_describe(x, structs) for x in t.types)
    if isinstance(t, msgspec.inspect.VarTupleType | msgspec.inspect.ListType):
        return f"{type(t).__name__}[{_describe(t.item_type, structs)}]"
    if isinstance(t, msgspec.inspect.DictType):
        return f"dict[{_describe(t.key_type, structs)}, {_describe(t.value_type, structs)}]"
    if isinstance(t, msgspec.inspect.LiteralType):
        return f"Literal{sorted(map(str, t.values))}"
    return type(t).__name__


def _struct_schema(t: msgspec.inspect.StructType, structs: dict[str, Any]) -> None:
    name = t.cls.__name__
    if name in structs:
        return
    structs[name] = {}
    structs[name] = {
        f.name: {"type": _describe(f.type, structs), "required": f.required} for f in t.fields
    }


def current_schema() -> dict[str, Any]:
    structs: dict[str, Any] = {}
    for cls in EVENT_TYPES.values():
        info = msgspec.inspect.type_info(cls)
        assert isinstance(info, msgspec.inspect.StructType)
        _struct_schema(info, structs)
    return {"events": sorted(EVENT_TYPES), "structs": structs}


def test_no_field_changed_type_or_disappeared_and_new_fields_have_defaults() -> None:
    path = GOLDEN / "schema.json"
    now = current_schema()
    if WRITE:
        path.write_text(json.dumps(now, indent=2, sort_keys=True) + "\n")
    shipped = json.loads(path.read_text())
    missing = set(shipped["events"]) - set(now["events"])
    assert not missing, f"event types removed: {sorted(missing)}"
    for struct, fields in shipped["structs"].items():
        assert struct in now["structs"], f"{struct}: struct no longer part of any event"
        for field, was in fields.items():
            is_ = now["structs"][struct].get(field)
            assert is_ is not None, f"{struct}.{field}: field removed"
            assert is_["type"] == was["type"], (
                f"{struct}.{field}: type changed from {was['type']} to {is_['type']}"
            )
            assert not (is_["required"] and not was["required"]), (
                f"{struct}.{field}: became required"
            )
        for field, is_ in now["structs"][struct].items():
            if field not in fields:
                assert not is_["required"], f"{struct}.{field}: new field without a default"


@pytest.mark.parametrize("event", samples(), ids=lambda e: e.event_type())
def test_golden_payloads_written_by_older_versions_still_decode(event: Any) -> None:
    tag = event.event_type()
    full = GOLDEN / f"{tag}.json"
    if WRITE and not full.exists():
        full.write_bytes(msgspec.json.format(encode(event)) + b"\n")
    assert full.exists(), f"no golden payload for {tag}: run with NEURON_DRA_WRITE_GOLDEN=1"
    decoded = decode(full.read_bytes())
    assert type(decoded) is type(event)
    assert decoded == event


def test_every_golden_payload_decodes() -> None:
    files = sorted(GOLDEN.glob("*.json"))
    payloads = [f for f in files if f.name != "schema.json"]
    assert {f.stem.split(".minimal")[0] for f in payloads} >= set(EVENT_TYPES)
    for f in payloads:
        decode(f.read_bytes())


def test_newer_writer_fields_are_ignored_by_an_older_reader() -> None:
    payload = json.loads(encode(samples()[1]))
    payload["added_in_a_later_version"] = {"anything": [1, 2]}
    assert decode(json.dumps(payload).encode()) == samples()[1]


def test_unknown_type_and_bad_fields_name_what_is_wrong() -> None:
    with pytest.raises(DecodeError, match=r"Invalid value 'node.inventory.v9'"):
        decode(b'{"type":"node.inventory.v9","node":"a"}')
    with pytest.raises(DecodeError, match=r"\$\.sequence"):
        decode(
            b'{"type":"node.heartbeat.v1","node":"a","boot_id":"b","sequence":"x",'
            b'"sent_at":"2026-01-01T00:00:00Z"}'
        )
    with pytest.raises(DecodeError, match="not JSON"):
        decode(b"\x00garbage")
    # A string that is not UTF-8 is a DecodeError too, not the decoder's UnicodeDecodeError
    # (which no consumer would turn into a dead letter).
    with pytest.raises(DecodeError, match="not UTF-8"):
        decode(b'{"type":"node.heartbeat.v1","node":"\xa9"}')


@pytest.mark.parametrize("event", samples(), ids=lambda e: e.event_type())
def test_subjects_are_well_formed(event: Any) -> None:
    tokens = event.subject.split(".")
    assert tokens[0] == "neuron"
    assert all(tokens)
    assert not any(c in event.subject for c in " *>")
