"""CloudEvents binary-mode attributes and de-duplication ids as NATS headers."""

from __future__ import annotations

import uuid
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
    "cloud_event_attributes",
    "event_headers",
    "new_msg_id",
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


def new_msg_id() -> str:
    """A fresh, unique message id (also the CloudEvents id)."""
    return uuid.uuid4().hex


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
        CE_TIME: datetime.now(UTC).isoformat(),
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
