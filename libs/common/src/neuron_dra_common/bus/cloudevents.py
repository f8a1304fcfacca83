"""Events as CloudEvents 1.0 in structured mode: one JSON object per event, for log shippers.

On the bus an event travels in binary mode (the attributes in ``ce-*`` headers, the event as
the payload). Written out for people and log pipelines it becomes one JSON object holding
both, ``data`` being the payload byte for byte::

    {"specversion":"1.0","id":"9f0c...","source":"/neuron-dra/health-monitor/ip-10-0-0-1",
     "type":"com.aws.neuron.device.health.v1","subject":"nodes/ip-10-0-0-1/devices/neurondevice3",
     "time":"2026-03-01T12:00:00.000+00:00","datacontenttype":"application/json",
     "data":{"type":"device.health.v1","node":"ip-10-0-0-1",...}}

An attribute missing from the headers (a message not published through :class:`Publisher`)
is filled from the event itself, so every line carries every required attribute.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Final

import msgspec

from neuron_dra_common.bus.headers import (
    CE_ID,
    CE_SOURCE,
    CE_SUBJECT,
    CE_TIME,
    CE_TYPE,
    CE_TYPE_PREFIX,
    MSG_ID,
    SPECVERSION,
)
from neuron_dra_common.events.base import Event

__all__ = [
    "DATACONTENTTYPE",
    "UNKNOWN_SOURCE",
    "CloudEvent",
    "cloud_event_id",
    "encode_line",
    "structured",
]

DATACONTENTTYPE: Final = "application/json"
#: The source of an event whose publisher did not say (no ``ce-source`` header).
UNKNOWN_SOURCE: Final = "/neuron-dra/unknown"
_TRACEPARENT: Final = "traceparent"


class CloudEvent(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A CloudEvents 1.0 event in structured JSON mode (``traceparent``: the distributed
    tracing extension, present when the event was published inside a trace)."""

    specversion: str
    id: str
    source: str
    type: str
    subject: str
    time: str
    datacontenttype: str
    data: msgspec.Raw
    traceparent: str = ""


class _Id(msgspec.Struct):
    id: str = ""


_encoder: Final = msgspec.json.Encoder()
_id_decoder: Final = msgspec.json.Decoder(_Id)


def structured(
    event: Event,
    *,
    payload: bytes,
    headers: Mapping[str, str] | None,
    fallback_id: str,
    stored_at: datetime | None = None,
) -> CloudEvent:
    """The structured CloudEvent of one message: ``event`` decoded from ``payload``.

    ``fallback_id`` is the id when the message has neither ``ce-id`` nor ``Nats-Msg-Id``
    (use something stable, such as the stream sequence); ``stored_at`` is the time when it
    has no ``ce-time`` (when the stream stored it; else now).
    """
    h = headers or {}
    time = h.get(CE_TIME) or (stored_at or datetime.now(UTC)).isoformat(timespec="milliseconds")
    return CloudEvent(
        specversion=SPECVERSION,
        id=h.get(CE_ID) or h.get(MSG_ID) or fallback_id,
        source=h.get(CE_SOURCE) or UNKNOWN_SOURCE,
        type=h.get(CE_TYPE) or CE_TYPE_PREFIX + event.event_type(),
        subject=h.get(CE_SUBJECT) or event.ce_subject,
        time=time,
        datacontenttype=DATACONTENTTYPE,
        data=msgspec.Raw(payload),
        traceparent=h.get(_TRACEPARENT, ""),
    )


def encode_line(ce: CloudEvent) -> bytes:
    """``ce`` as one JSON line (newline included)."""
    return _encoder.encode(ce) + b"\n"


def cloud_event_id(line: bytes) -> str:
    """The ``id`` of a line :func:`encode_line` wrote; "" if the line is not one."""
    try:
        return _id_decoder.decode(line).id
    except (msgspec.DecodeError, UnicodeDecodeError):  # a string that is not UTF-8
        return ""
