"""The wire's protocol parser: messages read by position, whatever way the reads cut them."""

from __future__ import annotations

from typing import Any

import pytest
from nats.aio.client import Client
from nats.errors import ProtocolError
from nats.protocol.parser import AWAITING_CONTROL_LINE, Parser
from neuron_dra_common.bus.wire import RawMsg, Wire

RAW_SID = 7
OTHER_SID = 9

Raw = RawMsg


class Recorder:
    """A client with a wire; what reaches raw handlers, nats-py's dispatch and its callbacks."""

    def __init__(self) -> None:
        self.nc = Client()
        self.wire = Wire.of(self.nc)
        self.raw: list[Raw] = []
        self.other: list[tuple[Any, ...]] = []
        self.calls: list[str] = []
        self.reads = 0
        self.wire.route(RAW_SID, self.raw.append, self.woken)

        async def process_msg(*args: Any) -> None:
            self.other.append(args)

        async def ping() -> None:
            self.calls.append("ping")

        async def pong() -> None:
            self.calls.append("pong")

        async def info(info: dict[str, Any], initial_connection: bool = False) -> None:
            self.calls.append(f"info {info['server_id']}")

        async def err(message: str) -> None:
            self.calls.append(f"err {message}")

        # Looked up on the client at each message, as nats-py's own parser does.
        self.nc._process_msg = process_msg  # type: ignore[method-assign,assignment]
        self.nc._process_ping = ping  # type: ignore[method-assign]
        self.nc._process_pong = pong  # type: ignore[method-assign]
        self.nc._process_info = info  # type: ignore[method-assign]
        self.nc._process_err = err  # type: ignore[method-assign,assignment]

    def woken(self) -> None:
        self.reads += 1

    async def feed(self, data: bytes, *, step: int | None = None) -> None:
        step = step or len(data) or 1
        for lo in range(0, len(data), step):
            await self.nc._ps.parse(data[lo : lo + step])


HEADERS = b"NATS/1.0\r\nNats-Msg-Id: a1\r\nce-type: t\r\n\r\n"
STATUS = b"NATS/1.0 408 Request Timeout\r\n\r\n"
PUBACK = b'{"stream":"NEURON_HEALTH","seq":1}'
STREAM = (
    b'HMSG neuron.health.n.d 7 $JS.ACK.S.C.1.5.5.1700000000000000000.0 %d %d\r\n%b{"x":1}\r\n'
    % (len(HEADERS), len(HEADERS) + 7, HEADERS)
    + b"PING\r\n"
    + b"MSG _INBOX.abc.42 7 %d\r\n%b\r\n" % (len(PUBACK), PUBACK)
    + b"MSG other.subject 9 reply.to 2\r\nhi\r\n"
    + b"+OK\r\n"
    + b"HMSG _INBOX.x 7 %d %d\r\n%b\r\n" % (len(STATUS), len(STATUS), STATUS)
    + b"PONG\r\n"
    + b'INFO {"server_id":"S1"}\r\n'
    + b"MSG empty 7 0\r\n\r\n"
)


def expected_raw() -> list[Raw]:
    return [
        (
            b"neuron.health.n.d",
            b"$JS.ACK.S.C.1.5.5.1700000000000000000.0",
            b'{"x":1}',
            HEADERS,
        ),
        (b"_INBOX.abc.42", b"", PUBACK, None),
        (b"_INBOX.x", b"", b"", STATUS),
        (b"empty", b"", b"", None),
    ]


def raw_ends(step: int) -> list[int]:
    """Where in ``STREAM`` each raw message ends (the read that completes it)."""
    ends, pos = [], 0
    for subject, _, payload, headers in expected_raw():
        pos = STREAM.index(subject, pos)
        pos = STREAM.index(b"\r\n", pos) + 2 + len(headers or b"") + len(payload) + 1
        ends.append(pos)
    return ends


@pytest.mark.parametrize("step", [None, 1, 2, 3, 7, 16, 64, 100])
async def test_every_message_and_line_whatever_the_reads(step: int | None) -> None:
    rec = Recorder()
    await rec.feed(STREAM, step=step)
    assert rec.raw == expected_raw()
    assert rec.other == [(OTHER_SID, b"other.subject", b"reply.to", b"hi", None)]
    assert rec.calls == ["ping", "pong", "info S1"]
    assert not rec.nc._ps.buf
    assert rec.nc.stats["in_msgs"] == 4
    # Woken once per read that brought raw messages, not once per message.
    assert rec.reads == (1 if step is None else len({lo // step for lo in raw_ends(step)}))


async def test_reset_drops_a_message_cut_in_two() -> None:
    rec = Recorder()
    await rec.feed(b"MSG _INBOX.abc.1 7 5\r\nhel")
    rec.nc._ps.reset()
    await rec.feed(b"MSG _INBOX.abc.2 7 2\r\nok\r\n")
    assert rec.raw == [(b"_INBOX.abc.2", b"", b"ok", None)]


async def test_errors_go_to_the_client_and_garbage_is_a_protocol_error() -> None:
    rec = Recorder()
    await rec.feed(b"-ERR 'Stale Connection'\r\n")
    assert rec.calls == ["err 'stale connection'"]
    with pytest.raises(ProtocolError):
        await rec.feed(b"BOGUS line\r\n")
    with pytest.raises(ProtocolError):
        await Recorder().feed(b"HMSG a 7 x y\r\n")


async def test_a_failing_handler_does_not_stop_the_reader() -> None:
    rec = Recorder()

    def broken(msg: RawMsg) -> None:
        raise RuntimeError("bug")

    rec.wire.route(RAW_SID, broken)
    await rec.feed(b"MSG a 7 1\r\nx\r\nMSG b 9 1\r\ny\r\n")
    assert rec.other == [(OTHER_SID, b"b", b"", b"y", None)]


async def test_the_replaced_parser_finishes_the_message_it_was_reading() -> None:
    nc = Client()
    old = nc._ps
    await old.parse(b"MSG _INBOX.abc.1 7 5\r\nhel")  # a read cut short, before the wire
    assert old.state != AWAITING_CONTROL_LINE
    seen: list[Raw] = []
    wire = Wire.of(nc)
    wire.route(RAW_SID, seen.append)
    assert isinstance(nc._ps, Parser)
    assert nc._ps is not old
    await nc._ps.parse(b"lo\r\nMSG _INBOX.abc.2 7 2\r\n")
    await nc._ps.parse(b"ok\r\n")
    assert seen == [(b"_INBOX.abc.1", b"", b"hello", None), (b"_INBOX.abc.2", b"", b"ok", None)]
