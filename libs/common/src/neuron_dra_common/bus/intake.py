"""What every consumer checks before a message reaches its handler: size, event, subject.

The runner, the projections, start-up replays and the request responder all call
:func:`admit`, so a message one of them refuses is refused by all of them for the same
reason, and the refusal becomes a dead letter naming what was wrong. Pure: no I/O.

>>> try:
...     admit(b'{"type":"node.heartbeat.v1"}', subject="neuron.heartbeat.a", limits=LIMITS)
... except Refused as refused:
...     print(refused.kind, refused)
decode event payload: Object missing required field `node`
"""

from __future__ import annotations

from typing import Final

import msgspec

from neuron_dra_common.bus.deadletter import DeadLetterKind
from neuron_dra_common.bus.declarations import published_subject
from neuron_dra_common.events.base import Event, subject_token
from neuron_dra_common.events.catalog import NodeInventory
from neuron_dra_common.events.codec import AnyEvent, DecodeError, decode
from neuron_dra_common.settings import ServiceSettings

__all__ = [
    "DEFAULT_MAX_INVENTORY_DEVICES",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "IntakeLimits",
    "Refused",
    "admit",
    "limits_of",
]

#: NATS's own default ``max_payload``: nothing larger is published unless the server allows it.
DEFAULT_MAX_MESSAGE_BYTES: Final = 1 << 20
#: The Neuron driver names at most 64 devices per host (``/dev/neuron0..63``); the largest
#: instance has 16. An inventory beyond what a host can have is not a node, and turning it
#: into slices would flood the API (5,000 devices made 40 ResourceSlices).
DEFAULT_MAX_INVENTORY_DEVICES: Final = 64


class IntakeLimits(msgspec.Struct, frozen=True, kw_only=True):
    """The largest message and inventory a consumer accepts."""

    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_inventory_devices: int = DEFAULT_MAX_INVENTORY_DEVICES


def limits_of(settings: ServiceSettings) -> IntakeLimits:
    """The limits a service was configured with (``NEURON_DRA_BUS_MAX_*``)."""
    return IntakeLimits(
        max_message_bytes=settings.bus_max_message_bytes,
        max_inventory_devices=settings.bus_max_inventory_devices,
    )


class Refused(ValueError):
    """A message no consumer handles; ``kind`` is its dead-letter kind, the text says why."""

    def __init__(self, reason: str, *, kind: DeadLetterKind) -> None:
        super().__init__(reason)
        self.kind: DeadLetterKind = kind


def admit(
    payload: bytes,
    *,
    subject: str,
    limits: IntakeLimits,
    accepts: tuple[type[Event], ...] = (),
) -> AnyEvent:
    """The event ``payload`` carries, if a consumer of ``subject`` may handle it.

    Refused, in this order: a payload over ``limits.max_message_bytes`` (before it is
    parsed); one that is not a known event (a node name that is not a DNS-1123 subdomain
    included); an event of a type not in ``accepts`` (when
    given: a request subject, whose events do not name it); otherwise an event whose own
    subject is not ``subject`` (the wrong type for the subject, or a body about another node
    or object than the subject); a ``NodeInventory`` over ``limits.max_inventory_devices``.
    """
    # What the stream stored under a subject of its own making is judged, and told, by the
    # subject it was published on.
    subject = published_subject(subject)
    size = len(payload)
    if size > limits.max_message_bytes:
        raise Refused(
            f"message on {subject}: {size} bytes is over the limit of "
            f"{limits.max_message_bytes} bytes",
            kind="refused",
        )
    try:
        event = decode(payload)
    except DecodeError as exc:
        raise Refused(str(exc), kind="decode") from None
    if accepts:
        if not isinstance(event, accepts):
            names = ", ".join(cls.event_type() for cls in accepts)
            raise Refused(
                f"message on {subject}: {event.event_type()} is not one of {names}",
                kind="refused",
            )
    else:
        try:
            own = event.subject
        except ValueError as exc:
            raise Refused(f"{event.event_type()} on {subject}: {exc}", kind="refused") from None
        if own != subject:
            node = getattr(event, "node", None)
            # Said in the operator's terms when it is a node's event sent under another node's
            # subject (a node agent posing as another, or a bug in one).
            whose = ""
            if isinstance(node, str) and subject_token(node) not in subject.split("."):
                whose = f" (its body is about node {node})"
            raise Refused(
                f"{event.event_type()} on {subject}: its body belongs on {own}{whose}",
                kind="refused",
            )
    if isinstance(event, NodeInventory):
        count = len(event.hardware.devices)
        if count > limits.max_inventory_devices:
            raise Refused(
                f"NodeInventory {event.node}: hardware.devices has {count} devices, over the "
                f"limit of {limits.max_inventory_devices}",
                kind="refused",
            )
    return event
