"""Reading a stream's history as a person would: from a start time, in order, then following.

:func:`read_history` is for tools (``neuron-dra events``): an ordered, ephemeral consumer
that leaves nothing behind on the server, starts at the first message stored at or after
``since`` (or the first one), and either stops once it has read what was stored when it
started or keeps following new messages. Messages it cannot decode are handed over too (with
``event`` None and the reason), so a reader sees that they exist.

>>> async for stored in read_history(bus, stream="NEURON_AUDIT", since=an_hour_ago):
...     print(stored.sequence, stored.event)
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import msgspec
import nats.errors
from nats.js import api

from neuron_dra_common.bus.connection import Bus
from neuron_dra_common.bus.follow import nothing_to_read
from neuron_dra_common.events.base import SUBJECT_ROOT
from neuron_dra_common.events.codec import AnyEvent, DecodeError, decode

__all__ = ["StoredMessage", "read_history"]


class StoredMessage(msgspec.Struct, frozen=True, kw_only=True):
    """One message of a stream, decoded when it could be (``error`` says why not)."""

    subject: str
    sequence: int
    stored_at: datetime
    headers: dict[str, str]
    payload: bytes
    event: AnyEvent | None
    error: str = ""


async def read_history(
    bus: Bus,
    *,
    stream: str,
    subject: str = f"{SUBJECT_ROOT}.>",
    since: datetime | None = None,
    follow: bool = False,
    poll: float = 0.5,
) -> AsyncIterator[StoredMessage]:
    """Messages of ``subject`` in ``stream`` from ``since`` on, in stream order.

    Without ``follow`` it ends after the last message stored when it started (at once if
    there is none); with ``follow`` it waits for new ones until the caller stops iterating.
    """
    if since is not None:
        config = api.ConsumerConfig(
            deliver_policy=api.DeliverPolicy.BY_START_TIME,
            opt_start_time=since.astimezone(UTC),
        )
        sub = await bus.js.subscribe(subject, stream=stream, ordered_consumer=True, config=config)
    else:
        sub = await bus.js.subscribe(
            subject, stream=stream, ordered_consumer=True, deliver_policy=api.DeliverPolicy.ALL
        )
    try:
        done = nothing_to_read(await sub.consumer_info()) and not follow
        while not done:
            try:
                msg = await sub.next_msg(timeout=poll)
            except (nats.errors.TimeoutError, TimeoutError):
                continue
            meta = msg.metadata
            event: AnyEvent | None
            try:
                event, error = decode(msg.data), ""
            except DecodeError as exc:
                event, error = None, str(exc)
            yield StoredMessage(
                subject=msg.subject,
                sequence=meta.sequence.stream,
                stored_at=meta.timestamp,
                headers=dict(msg.headers or {}),
                payload=msg.data,
                event=event,
                error=error,
            )
            done = meta.num_pending == 0 and not follow
    finally:
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()
