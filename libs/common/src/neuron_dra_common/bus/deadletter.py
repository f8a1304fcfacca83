"""The dead letter: where a message goes when it cannot be decoded or keeps failing.

The dead-letter message carries the original payload byte for byte, the original headers,
and ``x-dead-letter-*`` headers saying why, from where, and after how many deliveries.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Final, Literal

import msgspec
from nats.js import JetStreamContext

from neuron_dra_common.bus import metrics
from neuron_dra_common.bus.declarations import ConsumerSpec, dead_letter_subject
from neuron_dra_common.bus.headers import MSG_ID

__all__ = [
    "DL_CONSUMER",
    "DL_DELIVERIES",
    "DL_KIND",
    "DL_ORIGINAL_MSG_ID",
    "DL_REASON",
    "DL_SEQUENCE",
    "DL_STREAM",
    "DL_SUBJECT",
    "DL_TIME",
    "DeadLetterKind",
    "DeadLetterRecord",
    "publish_dead_letter",
    "read_dead_letter",
]

#: ``decode``: not an event; ``refused``: an event no consumer may handle (too large, on the
#: wrong subject, over a limit); ``permanent``: the handler said retrying cannot help;
#: ``handler``: the handler kept failing; ``exhausted``: delivered too often without an outcome.
DeadLetterKind = Literal["decode", "refused", "handler", "permanent", "exhausted"]

DL_REASON: Final = "x-dead-letter-reason"
DL_KIND: Final = "x-dead-letter-kind"
DL_STREAM: Final = "x-dead-letter-stream"
DL_CONSUMER: Final = "x-dead-letter-consumer"
DL_SUBJECT: Final = "x-dead-letter-subject"
DL_SEQUENCE: Final = "x-dead-letter-sequence"
DL_DELIVERIES: Final = "x-dead-letter-deliveries"
DL_TIME: Final = "x-dead-letter-time"
DL_ORIGINAL_MSG_ID: Final = "x-dead-letter-original-msg-id"
_MAX_REASON: Final = 2000


class DeadLetterRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A dead-letter message read back: the original and why it was set aside."""

    reason: str
    kind: str
    stream: str
    consumer: str
    subject: str
    sequence: int
    deliveries: int
    payload: bytes
    headers: dict[str, str]


async def publish_dead_letter(
    js: JetStreamContext,
    *,
    spec: ConsumerSpec,
    subject: str,
    payload: bytes,
    headers: Mapping[str, str] | None,
    sequence: int,
    deliveries: int,
    kind: DeadLetterKind,
    reason: str,
    msg_id: str = "",
    ack_timeout: float = 5.0,
) -> None:
    """Store the original message on the consumer's dead-letter subject, waiting for the ack.

    Its ``Nats-Msg-Id`` is derived from stream, sequence, consumer and payload, so
    dead-lettering the same stored message twice (the ack of the original was lost, or a
    projection replayed its stream again) stores it once, while a stream recreated with its
    sequences from 1 again does not hide a new message behind an old one. ``msg_id`` replaces
    it where there is no stream sequence (a request).
    """
    digest = hashlib.blake2b(payload, digest_size=8).hexdigest()
    original = dict(headers or {})
    dl_headers = {k: v for k, v in original.items() if k != MSG_ID}
    dl_headers.update(
        {
            MSG_ID: msg_id or f"dl:{spec.stream}:{sequence}:{spec.durable}:{digest}",
            DL_REASON: reason[:_MAX_REASON].replace("\r", " ").replace("\n", " "),
            DL_KIND: kind,
            DL_STREAM: spec.stream,
            DL_CONSUMER: spec.durable,
            DL_SUBJECT: subject,
            DL_SEQUENCE: str(sequence),
            DL_DELIVERIES: str(deliveries),
            DL_TIME: datetime.now(UTC).isoformat(),
        }
    )
    if MSG_ID in original:
        dl_headers[DL_ORIGINAL_MSG_ID] = original[MSG_ID]
    await js.publish(dead_letter_subject(spec), payload, timeout=ack_timeout, headers=dl_headers)
    metrics.DEAD_LETTERS.labels(spec.durable, kind).inc()


def read_dead_letter(payload: bytes, headers: Mapping[str, str] | None) -> DeadLetterRecord:
    """Parse a message taken from a dead-letter subject; original headers come back as sent."""
    h = dict(headers or {})
    original = {k: v for k, v in h.items() if not k.startswith("x-dead-letter-") and k != MSG_ID}
    if DL_ORIGINAL_MSG_ID in h:
        original[MSG_ID] = h[DL_ORIGINAL_MSG_ID]
    return DeadLetterRecord(
        reason=h.get(DL_REASON, ""),
        kind=h.get(DL_KIND, ""),
        stream=h.get(DL_STREAM, ""),
        consumer=h.get(DL_CONSUMER, ""),
        subject=h.get(DL_SUBJECT, ""),
        sequence=int(h.get(DL_SEQUENCE, "0")),
        deliveries=int(h.get(DL_DELIVERIES, "0")),
        payload=payload,
        headers=original,
    )
