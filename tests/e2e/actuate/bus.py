"""Reading the product's events from the stack's NATS, as an audit subscriber would (as the
stack's bus admin on its authenticated bus)."""

from __future__ import annotations

import asyncio

import nats
from nats.js.api import RawStreamMsg
from nats.js.errors import NotFoundError
from neuron_dra_common.events.base import subject_token
from neuron_dra_common.events.codec import AnyEvent, decode

from tests.fixtures.stack import KubeStack


async def _last_message(stack: KubeStack, subject: str, stream: str) -> RawStreamMsg | None:
    given = stack.bus_credentials()
    nc = await nats.connect(
        stack.nats_url, token=given.token() if given.token_file else None, tls=given.tls()
    )
    try:
        return await nc.jetstream().get_last_msg(stream, subject)
    except NotFoundError:
        return None
    finally:
        await nc.close()


def last_event(stack: KubeStack, subject: str, *, stream: str = "NEURON_CLAIMS") -> AnyEvent | None:
    """The last event stored on ``subject``, or ``None``."""
    msg = asyncio.run(_last_message(stack, subject, stream))
    return None if msg is None else decode(msg.data or b"")


def last_stored(
    stack: KubeStack, subject: str, *, stream: str = "NEURON_CLAIMS"
) -> tuple[int, str] | None:
    """The stream sequence and event id of the last message stored on ``subject``."""
    msg = asyncio.run(_last_message(stack, subject, stream))
    return None if msg is None else (msg.seq or 0, (msg.headers or {}).get("Nats-Msg-Id", ""))


def claim_subject(kind: str, *, node: str, namespace: str, name: str) -> str:
    """``neuron.claim.<kind>.<node>.<namespace>.<name>``."""
    tokens = ".".join(subject_token(t) for t in (node, namespace, name))
    return f"neuron.claim.{kind}.{tokens}"
