"""Reading the product's events from the stack's NATS, as an audit subscriber would."""

from __future__ import annotations

import asyncio

import nats
from nats.js.api import RawStreamMsg
from nats.js.errors import NotFoundError
from neuron_dra_common.events.base import subject_token
from neuron_dra_common.events.codec import AnyEvent, decode


async def _last_message(nats_url: str, subject: str, stream: str) -> RawStreamMsg | None:
    nc = await nats.connect(nats_url)
    try:
        return await nc.jetstream().get_last_msg(stream, subject)
    except NotFoundError:
        return None
    finally:
        await nc.close()


def last_event(nats_url: str, subject: str, *, stream: str = "NEURON_CLAIMS") -> AnyEvent | None:
    """The last event stored on ``subject``, or ``None``."""
    msg = asyncio.run(_last_message(nats_url, subject, stream))
    return None if msg is None else decode(msg.data or b"")


def last_stored(
    nats_url: str, subject: str, *, stream: str = "NEURON_CLAIMS"
) -> tuple[int, str] | None:
    """The stream sequence and event id of the last message stored on ``subject``."""
    msg = asyncio.run(_last_message(nats_url, subject, stream))
    return None if msg is None else (msg.seq or 0, (msg.headers or {}).get("Nats-Msg-Id", ""))


def claim_subject(kind: str, *, node: str, namespace: str, name: str) -> str:
    """``neuron.claim.<kind>.<node>.<namespace>.<name>``."""
    tokens = ".".join(subject_token(t) for t in (node, namespace, name))
    return f"neuron.claim.{kind}.{tokens}"
