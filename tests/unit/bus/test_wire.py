"""The wire format the bus writes and reads itself, and the nats-py internals it relies on."""

from __future__ import annotations

import inspect
from datetime import datetime, timedelta
from importlib.metadata import version

import nats.errors
import pytest
from nats.aio.client import Client
from nats.protocol import parser
from neuron_dra_common.bus.headers import ce_time, new_msg_id, new_msg_ids
from neuron_dra_common.bus.wire import (
    Wire,
    ack_metadata,
    clean_value,
    encode_header_block,
    header_lines,
    hpub,
    parse_header_block,
    pub,
)


def test_nats_py_internals_the_wire_uses_are_there() -> None:
    # The wire hooks into these; a nats-py upgrade that changes them must fail here first.
    assert version("nats-py") == "2.16.0"
    params = list(inspect.signature(Client._process_msg).parameters)
    assert params == ["self", "sid", "subject", "reply", "data", "headers"]
    assert inspect.iscoroutinefunction(Client._process_msg)
    assert list(inspect.signature(Client._send_command).parameters)[:2] == ["self", "cmd"]
    assert inspect.iscoroutinefunction(Client._flush_pending)
    client = Client()
    for attr in (
        "_pending",
        "_pending_data_size",
        "_max_pending_size",
        "_flush_queue",
        "_flusher_task",
        "_ps",
    ):
        assert hasattr(client, attr), attr
    # The wire's parser replaces the client's: same base class, state and callbacks.
    assert type(client._ps) is parser.Parser
    assert isinstance(client._ps.buf, bytearray)
    assert client._ps.state == parser.AWAITING_CONTROL_LINE
    assert inspect.iscoroutinefunction(parser.Parser.parse)
    for name in ("_process_ping", "_process_pong", "_process_info", "_process_err"):
        assert inspect.iscoroutinefunction(getattr(Client, name)), name


async def test_writes_queued_while_disconnected_wait_for_the_reconnect() -> None:
    client = Client()
    client._max_pending_size = 100
    wire = Wire.of(client)
    wire.send_nowait(pub("r.1", b"+ACK"))
    assert client._pending == [b"PUB r.1 4\r\n+ACK\r\n"]
    assert client._pending_data_size == len(client._pending[0])
    with pytest.raises(nats.errors.OutboundBufferLimitError):
        wire.send_nowait(b"x" * 100)


def test_header_block_round_trips() -> None:
    headers = {"Nats-Msg-Id": "abc", "ce-subject": "node/ip-1", "traceparent": "00-1-2-01"}
    block = encode_header_block(header_lines(headers))
    assert block.startswith(b"NATS/1.0\r\n")
    assert block.endswith(b"\r\n\r\n")
    assert parse_header_block(block) == headers


def test_header_values_stay_on_one_line_and_names_are_tokens() -> None:
    assert clean_value("a\r\nb") == "a  b"
    block = encode_header_block(header_lines({"ce-subject": "x\ny"}))
    assert parse_header_block(block) == {"ce-subject": "x y"}
    with pytest.raises(ValueError, match="not a token"):
        header_lines({"bad name": "x"})


def test_status_and_loose_header_lines_parse_as_nats_py_would() -> None:
    block = b"NATS/1.0 408 Request Timeout\r\nNats-Pending-Messages: 5\r\n\r\n"
    assert parse_header_block(block) == {
        "Status": "408",
        "Description": "Request Timeout",
        "Nats-Pending-Messages": "5",
    }
    assert parse_header_block(b"NATS/1.0 100\r\n\r\n") == {"Status": "100"}
    loose = b"NATS/1.0\r\nA:1\r\nB :\t2 \r\nno colon\r\nbad name: 3\r\n\r\n"
    assert parse_header_block(loose) == {"A": "1", "B": "2"}


def test_commands_are_framed_with_their_sizes() -> None:
    assert pub("r.1", b"+ACK") == b"PUB r.1 4\r\n+ACK\r\n"
    block = encode_header_block(header_lines({"a": "b"}))
    assert hpub("s.1", "in.2", block, b"{}") == (
        b"HPUB s.1 in.2 %d %d\r\n%b{}\r\n" % (len(block), len(block) + 2, block)
    )


@pytest.mark.parametrize(
    "reply",
    [
        "$JS.ACK.HEALTH.worker.3.1042.17.1700000000000000000.9",
        "$JS.ACK.hub.ACCHASH.HEALTH.worker.3.1042.17.1700000000000000000.9.tok",
    ],
)
def test_ack_subject_metadata_in_both_forms(reply: str) -> None:
    meta = ack_metadata(reply)
    assert meta is not None
    assert (meta.stream, meta.consumer, meta.deliveries) == ("HEALTH", "worker", 3)
    assert (meta.stream_sequence, meta.consumer_sequence, meta.pending) == (1042, 17, 9)


@pytest.mark.parametrize("reply", ["", "_INBOX.abc", "$JS.ACK.S.C.x.1.1.1.1", "a.b.c.d.e.f.g.h.i"])
def test_other_subjects_are_not_ack_subjects(reply: str) -> None:
    assert ack_metadata(reply) is None


def test_msg_ids_are_unique_and_uuid_sized() -> None:
    ids = {new_msg_id() for _ in range(10_000)}
    ids.update(new_msg_ids(10_000))  # in runs, across the 4096 boundaries of the table
    ids.add(new_msg_id())
    assert len(ids) == 20_001
    assert {len(i) for i in ids} == {32}
    assert all(int(i, 16) >= 0 for i in ids)


def test_msg_ids_of_a_run_count_up() -> None:
    run = new_msg_ids(5000)
    numbers = [int(i[16:], 16) for i in run]
    assert numbers == list(range(numbers[0], numbers[0] + 5000))
    assert {i[:16] for i in run} == {new_msg_id()[:16]}


def test_ce_time_is_rfc3339_in_utc_now() -> None:
    stamp = datetime.fromisoformat(ce_time())
    assert stamp.utcoffset() == timedelta(0)
    assert abs((datetime.now(stamp.tzinfo) - stamp).total_seconds()) < 1
