"""CloudEvents binary-mode attributes and de-duplication ids as NATS headers."""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Final

import msgspec

from neuron_dra_common.events.base import Event
from neuron_dra_common.telemetry.propagation import inject_headers

__all__ = [
    "CE_ID",
    "CE_SOURCE",
    "CE_SPECVERSION",
    "CE_SUBJECT",
    "CE_TIME",
    "CE_TYPE",
    "CONTENT_TYPE",
    "MSG_ID",
    "SPECVERSION",
    "CloudEventAttributes",
    "ce_time",
    "cloud_event_attributes",
    "event_headers",
    "new_msg_id",
    "new_msg_ids",
]

MSG_ID: Final = "Nats-Msg-Id"
CE_ID: Final = "ce-id"
CE_SOURCE: Final = "ce-source"
CE_TYPE: Final = "ce-type"
CE_SPECVERSION: Final = "ce-specversion"
CE_TIME: Final = "ce-time"
CE_SUBJECT: Final = "ce-subject"
CONTENT_TYPE: Final = "content-type"
SPECVERSION: Final = "1.0"
#: ``ce-type`` is reverse-DNS of the driver name, then the event's tag.
CE_TYPE_PREFIX: Final = "com.aws.neuron."


class CloudEventAttributes(msgspec.Struct, frozen=True, kw_only=True):
    """The CloudEvents context attributes read back from a message's headers."""

    id: str
    source: str
    type: str
    specversion: str
    time: str = ""
    subject: str = ""


class _Ids:
    """Unique ids: 64 random bits per process, then a counter (32 hex digits, like a uuid).

    Much cheaper than a random uuid per event; a forked child draws its own random half.
    Ids are handed out in runs (one per batch of events): the last three hex digits come
    from a table and the rest is formatted once per 4096 ids.
    """

    def __init__(self) -> None:
        self.reseed()

    def reseed(self) -> None:
        self.prefix = secrets.token_hex(8)
        self.next = 0
        self.lock = threading.Lock()

    def take(self, count: int) -> list[str]:
        with self.lock:
            start = self.next
            self.next = start + count
        prefix, low = self.prefix, _LOW_DIGITS
        ids: list[str] = []
        high = -1
        head = ""
        for n in range(start, start + count):
            if n >> 12 != high:
                high = n >> 12
                head = f"{prefix}{high:013x}"
            ids.append(head + low[n & 0xFFF])
        return ids


_LOW_DIGITS: Final = tuple(f"{n:03x}" for n in range(4096))
_IDS: Final = _Ids()
os.register_at_fork(after_in_child=_IDS.reseed)


def new_msg_id() -> str:
    """A fresh, unique message id (also the CloudEvents id)."""
    return _IDS.take(1)[0]


def new_msg_ids(count: int) -> list[str]:
    """``count`` fresh, unique message ids, cheaper than one call each."""
    return _IDS.take(count)


class _Clock:
    """``ce-time`` formatted once per millisecond, however many events share it."""

    millis = -1
    text = ""


_CLOCK: Final = _Clock()


def ce_time() -> str:
    """Now as RFC 3339 with milliseconds, the ``ce-time`` of events published now."""
    millis = time.time_ns() // 1_000_000
    if millis != _CLOCK.millis:
        _CLOCK.millis = millis
        _CLOCK.text = datetime.fromtimestamp(millis / 1000, UTC).isoformat(timespec="milliseconds")
    return _CLOCK.text


def event_headers(event: Event, *, source: str, msg_id: str) -> dict[str, str]:
    """Headers for publishing ``event``: de-duplication id, CloudEvents, trace context.

    ``content-type`` is left out: every payload is JSON, and each header costs parsing time
    on every consumer.

    ``msg_id`` is both ``Nats-Msg-Id`` and ``ce-id``, so a retried publish with the same id
    is stored once.
    """
    headers = {
        MSG_ID: msg_id,
        CE_ID: msg_id,
        CE_SOURCE: source,
        CE_TYPE: CE_TYPE_PREFIX + event.event_type(),
        CE_SPECVERSION: SPECVERSION,
        CE_TIME: ce_time(),
        CE_SUBJECT: event.ce_subject,
    }
    inject_headers(headers)
    return headers


def cloud_event_attributes(headers: Mapping[str, str] | None) -> CloudEventAttributes | None:
    """The CloudEvents attributes in ``headers``, or ``None`` if a required one is missing."""
    if not headers:
        return None
    try:
        return CloudEventAttributes(
            id=headers[CE_ID],
            source=headers[CE_SOURCE],
            type=headers[CE_TYPE],
            specversion=headers[CE_SPECVERSION],
            time=headers.get(CE_TIME, ""),
            subject=headers.get(CE_SUBJECT, ""),
        )
    except KeyError:
        return None
