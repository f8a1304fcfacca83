"""The bus's own traffic on the wire: raw subscriptions and protocol writes on a nats-py client.

For each incoming message nats-py matches the control line against several regular
expressions, copies the payload out of a bytearray, awaits a coroutine per message, parses
every header into a dict, builds a ``Msg`` and hands it to a task through a queue; for each
publish it checks and encodes the headers one by one and asks its flusher for a write. At
tens of thousands of events a second that is most of the time the bus spends. The bus's hot
traffic (consumer deliveries, PubAcks, acks, event publishes) therefore goes through
:class:`Wire`: the client's protocol parser is replaced by one that reads ``MSG`` and
``HMSG`` by position and hands a message of a raw subscription, as it came (subject, reply,
payload, header block), to a handler called in line; whole protocol commands are queued at
once. Every other protocol line goes to nats-py's own parser, and everything else (connect,
reconnect and re-subscribe, ping, TLS, the JetStream API, other subscriptions) stays with
nats-py and behaves as before.

This relies on internals of the pinned nats-py (2.16.0): the client reads through
``Client._ps.parse(data)`` (a ``nats.protocol.parser.Parser``, reset on reconnect), every
message is dispatched through ``Client._process_msg(sid, subject, reply, data, headers)``,
and writes are queued with ``Client._send_command`` (or appended to ``Client._pending``)
for the flusher task that ``Client._flush_pending`` wakes through ``Client._flush_queue``. ``tests/unit/bus/test_wire.py`` fails if any of them
changes.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import Final

import msgspec
import nats.errors
from nats.aio.client import Client
from nats.aio.subscription import Subscription
from nats.errors import ProtocolError
from nats.protocol.parser import AWAITING_CONTROL_LINE, MAX_CONTROL_LINE_SIZE, Parser

__all__ = [
    "AckMetadata",
    "RawHandler",
    "RawMsg",
    "Wire",
    "ack_metadata",
    "encode_header_block",
    "hpub",
    "parse_header_block",
    "pub",
]

#: One message as it came: subject, reply, payload, header block (``None`` without headers).
RawMsg = tuple[bytes, bytes, bytes, bytes | None]
#: Called with each message of a raw subscription, in line with the parser: it must not
#: block (``deque.append`` will do).
RawHandler = Callable[[RawMsg], None]
#: Called once after a read that brought a raw subscription messages.
AfterRead = Callable[[], None]
#: A raw subscription's handler and what to call after a read that reached it.
_Route = tuple[RawHandler, AfterRead | None]

log = logging.getLogger(__name__)

HEADER_LINE: Final = b"NATS/1.0\r\n"
_CRLF: Final = "\r\n"
STATUS: Final = "Status"
DESCRIPTION: Final = "Description"


class Wire:
    """Raw subscriptions and command writes on one nats-py client (one per client).

    >>> wire = Wire.of(nc)
    >>> sub = await wire.subscribe(inbox, on_message)
    >>> await wire.send(pub("reply.subject", b"+ACK"))
    """

    _by_client: weakref.WeakKeyDictionary[Client, Wire] = weakref.WeakKeyDictionary()

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        # Raw subscriptions by subscription id, and by the id as the server writes it.
        self._routes: dict[int, _Route] = {}
        self._routes_by_sid: dict[bytes, _Route] = {}
        self._sends: set[asyncio.Task[None]] = set()
        original: Callable[..., Awaitable[None]] = nc._process_msg
        routes = self._routes
        stats = nc.stats

        async def dispatch(
            sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None
        ) -> None:
            route = routes.get(sid)
            if route is None:
                await original(sid, subject, reply, data, headers)
                return
            stats["in_msgs"] += 1
            stats["in_bytes"] += len(data)
            handler, after = route
            handler((subject, reply, data, headers))
            if after is not None:
                after()

        # Instance attributes: only this client's dispatch and parser change. The dispatch
        # hook still routes raw messages that come through nats-py's own parser (the one
        # finishing a read that was under way when the wire was installed).
        nc._process_msg = dispatch  # type: ignore[method-assign]
        nc._ps = _Parser(nc, self._routes_by_sid, previous=nc._ps)

    @classmethod
    def of(cls, nc: Client) -> Wire:
        """The wire of ``nc``, installed on first use."""
        wire = cls._by_client.get(nc)
        if wire is None:
            wire = cls._by_client[nc] = cls(nc)
        return wire

    async def subscribe(
        self, subject: str, handler: RawHandler, *, after_read: AfterRead | None = None
    ) -> Subscription:
        """Subscribe ``handler`` to ``subject``; nats-py re-subscribes it after a reconnect.

        ``after_read`` is called once after each read that brought the subscription
        messages (to wake whoever works them off). Unsubscribe with :meth:`unsubscribe` so
        the handler is forgotten too.
        """
        sub = await self.nc.subscribe(subject, pending_msgs_limit=-1, pending_bytes_limit=-1)
        self.route(sub._id, handler, after_read)
        return sub

    def route(self, sid: int, handler: RawHandler, after_read: AfterRead | None = None) -> None:
        """Hand the messages of subscription ``sid`` to ``handler`` (see :meth:`subscribe`)."""
        self._routes[sid] = self._routes_by_sid[str(sid).encode()] = (handler, after_read)

    async def unsubscribe(self, sub: Subscription) -> None:
        self._routes.pop(sub._id, None)
        self._routes_by_sid.pop(str(sub._id).encode(), None)
        await sub.unsubscribe()

    async def send(self, commands: bytes) -> None:
        """Queue protocol ``commands`` for the next write.

        While reconnecting they wait in the client's reconnect buffer like any publish; the
        write happens when the flusher next runs (when the caller yields to the loop).
        """
        self._check(commands)
        nc = self.nc
        await nc._send_command(commands)
        queue = nc._flush_queue
        if queue is not None and queue.empty():
            await nc._flush_pending()

    def send_nowait(self, commands: bytes) -> None:
        """:meth:`send` from a callback: the commands join the client's pending writes at once.

        The flusher is woken as ``Client._flush_pending`` does; only when a write would have
        to wait (too much pending, or no flusher running) is :meth:`send` left to a task.
        """
        self._check(commands)
        nc = self.nc
        if nc.is_connected:
            flusher = nc._flusher_task
            if (
                flusher is None
                or flusher.done()
                or 0 < nc._max_pending_size < nc._pending_data_size + len(commands)
            ):
                task = asyncio.get_running_loop().create_task(self.send(commands))
                self._sends.add(task)
                task.add_done_callback(self._sent)
                return
        nc._pending.append(commands)
        nc._pending_data_size += len(commands)
        queue = nc._flush_queue
        if nc.is_connected and queue is not None and queue.empty():
            queue.put_nowait(asyncio.get_running_loop().create_future())

    def _sent(self, task: asyncio.Task[None]) -> None:
        self._sends.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("queued write failed", extra={"error": repr(task.exception())})

    def _check(self, commands: bytes) -> None:
        nc = self.nc
        if nc.is_closed:
            raise nats.errors.ConnectionClosedError
        if nc.is_draining_pubs:
            raise nats.errors.ConnectionDrainingError
        if not nc.is_connected and (
            nc._max_pending_size <= 0
            or len(commands) + nc._pending_data_size > nc._max_pending_size
        ):
            raise nats.errors.OutboundBufferLimitError


_MSG: Final = b"MSG "
_HMSG: Final = b"HMSG "
_H: Final = ord("H")
_M: Final = ord("M")
_CRLF_B: Final = b"\r\n"


class _Parser(Parser):
    """nats-py's protocol parser with ``MSG`` and ``HMSG`` read by position.

    A message of a raw subscription goes to its handler in line, with no ``Msg``, no header
    dict and no coroutine; any other message goes to ``Client._process_msg`` as before, and
    any other protocol line (``PING``, ``PONG``, ``+OK``, ``-ERR``, ``INFO``) to nats-py's
    parser, so its handling does not change. What is left of a read (a message cut in two)
    waits in ``buf``, which ``reset()`` (on reconnect) empties as before.
    """

    def __init__(self, nc: Client, routes: dict[bytes, _Route], *, previous: Parser | None) -> None:
        self._routes = routes
        super().__init__(nc)  # resets, which forgets any previous parser: set it after
        # The parser this one replaces, until it has finished what it was reading.
        self._previous = previous

    def reset(self) -> None:
        self._previous = None
        super().reset()

    async def parse(self, data: bytes = b"") -> None:
        previous = self._previous
        if previous is not None:
            if previous.buf or previous.state != AWAITING_CONTROL_LINE:
                await previous.parse(data)
                return
            self._previous = None
        if self.buf:
            data = bytes(self.buf) + data
            self.buf.clear()
        nc = self.nc
        routes = self._routes
        woken: list[AfterRead] = []
        size = len(data)
        pos = 0
        count = 0
        received = 0
        try:
            while pos < size:
                eol = data.find(_CRLF_B, pos)
                if eol < 0:
                    if size - pos > MAX_CONTROL_LINE_SIZE:
                        raise ProtocolError("nats: control line too long")
                    break
                first = data[pos]
                if first == _H and data.startswith(_HMSG, pos):
                    args = data[pos + 5 : eol].split()
                    if len(args) == 5:
                        subject, sid, reply, hlen, total = args
                    elif len(args) == 4:
                        subject, sid, hlen, total = args
                        reply = b""
                    else:
                        raise ProtocolError("nats: malformed HMSG")
                    start = eol + 2
                    split = start + int(hlen)
                    stop = start + int(total)
                    if stop + 2 > size:
                        break  # the payload is still on its way
                    headers: bytes | None = data[start:split]
                    payload = data[split:stop]
                elif first == _M and data.startswith(_MSG, pos):
                    args = data[pos + 4 : eol].split()
                    if len(args) == 4:
                        subject, sid, reply, total = args
                    elif len(args) == 3:
                        subject, sid, total = args
                        reply = b""
                    else:
                        raise ProtocolError("nats: malformed MSG")
                    start = eol + 2
                    stop = start + int(total)
                    if stop + 2 > size:
                        break
                    headers = None
                    payload = data[start:stop]
                else:
                    # Any other line: nats-py's parser, given exactly that line.
                    await Parser.parse(self, data[pos : eol + 2])
                    pos = eol + 2
                    continue
                pos = stop + 2
                route = routes.get(sid)
                if route is None:
                    await nc._process_msg(int(sid), subject, reply, payload, headers)
                    continue
                count += 1
                received += len(payload)
                handler, after = route
                try:
                    handler((subject, reply, payload, headers))
                except Exception:
                    # A handler's bug must not stop the connection's reader.
                    log.exception("raw message handler failed", extra={"subject": subject})
                if after is not None and after not in woken:
                    woken.append(after)
        except ValueError as exc:
            raise ProtocolError(f"nats: malformed message: {exc}") from exc
        finally:
            if count:
                stats = nc.stats
                stats["in_msgs"] += count
                stats["in_bytes"] += received
            for after in woken:
                try:
                    after()
                except Exception:
                    log.exception("after-read callback failed")
        if pos < size:
            self.buf.extend(data[pos:])


def pub(subject: str, payload: bytes) -> bytes:
    """A ``PUB`` command without reply or headers (acks, naks, pull requests need no more)."""
    return b"PUB %b %d\r\n%b\r\n" % (subject.encode(), len(payload), payload)


def pub_reply(subject: str, reply: str, payload: bytes) -> bytes:
    """A ``PUB`` command with a reply subject."""
    return b"PUB %b %b %d\r\n%b\r\n" % (subject.encode(), reply.encode(), len(payload), payload)


def hpub(subject: str, reply: str, header_block: bytes, payload: bytes) -> bytes:
    """An ``HPUB`` command; ``header_block`` from :func:`encode_header_block`."""
    hlen = len(header_block)
    return b"HPUB %b %b %d %d\r\n%b%b\r\n" % (
        subject.encode(),
        reply.encode(),
        hlen,
        hlen + len(payload),
        header_block,
        payload,
    )


def header_lines(headers: dict[str, str]) -> bytes:
    """``Name: value\\r\\n`` lines, with CR and LF in values turned into spaces."""
    out = []
    for key, value in headers.items():
        if not key or any(c in key for c in " \t\r\n:"):
            raise ValueError(f"header name {key!r} is not a token")
        out.append(f"{key}: {clean_value(value)}\r\n")
    return "".join(out).encode()


def clean_value(value: str) -> str:
    """A header value on one line (a CR or LF would end the header early)."""
    if "\r" in value or "\n" in value:
        return value.replace("\r", " ").replace("\n", " ")
    return value


def encode_header_block(*lines: bytes) -> bytes:
    """The header block of a message: the version line, the header lines, a blank line."""
    return b"".join((HEADER_LINE, *lines, b"\r\n"))


def parse_header_block(block: bytes) -> dict[str, str]:
    """The headers of a raw header block; a status line gives ``Status`` and ``Description``.

    >>> parse_header_block(b"NATS/1.0 408 Request Timeout\\r\\nNats-Pending-Messages: 5\\r\\n\\r\\n")
    {'Status': '408', 'Description': 'Request Timeout', 'Nats-Pending-Messages': '5'}
    """
    lines = block.decode("utf-8", "replace").split(_CRLF)
    out: dict[str, str] = {}
    first = lines[0]
    if len(first) > 9:
        # "NATS/1.0 408 Request Timeout": an inline status from the server.
        code, _, description = first[9:].strip().partition(" ")
        if code.isdigit():
            out[STATUS] = code
        if description:
            out[DESCRIPTION] = description
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if sep:
            name = name.strip()
            if name and " " not in name and "\t" not in name:
                out[name] = value.strip()
    return out


class AckMetadata(msgspec.Struct, frozen=True, kw_only=True):
    """What a JetStream delivery's reply subject says about it."""

    stream: str
    consumer: str
    deliveries: int
    stream_sequence: int
    consumer_sequence: int
    pending: int


def ack_metadata(reply: str) -> AckMetadata | None:
    """Parse ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>``.

    The newer form puts a domain and an account hash before the stream, and may end with a
    random token. ``None`` when ``reply`` is not a JetStream ack subject.
    """
    tokens = reply.split(".")
    if len(tokens) == 9:
        offset = 2
    elif len(tokens) >= 11:
        offset = 4
    else:
        return None
    if tokens[0] != "$JS" or tokens[1] != "ACK":
        return None
    try:
        return AckMetadata(
            stream=tokens[offset],
            consumer=tokens[offset + 1],
            deliveries=int(tokens[offset + 2]),
            stream_sequence=int(tokens[offset + 3]),
            consumer_sequence=int(tokens[offset + 4]),
            pending=int(tokens[offset + 6]),
        )
    except ValueError:
        return None
