"""The one tagged union of all events and its one decoder."""

from __future__ import annotations

from typing import Final

import msgspec

from neuron_dra_common.events.base import Event, check_node_name
from neuron_dra_common.events.catalog import (
    AlertStateChanged,
    AllocationDecided,
    AllocationReleased,
    AllocationRequested,
    ClaimPrepared,
    ClaimUnprepared,
    DeviceHealthChanged,
    DeviceTaintChanged,
    NodeHeartbeat,
    NodeInventory,
    NodeLost,
    NodeRecovered,
    WorkloadStateChanged,
)

__all__ = ["EVENT_TYPES", "AnyEvent", "DecodeError", "decode", "encode"]

AnyEvent = (
    NodeInventory
    | NodeHeartbeat
    | DeviceHealthChanged
    | DeviceTaintChanged
    | AllocationRequested
    | AllocationDecided
    | AllocationReleased
    | ClaimPrepared
    | ClaimUnprepared
    | WorkloadStateChanged
    | NodeLost
    | NodeRecovered
    | AlertStateChanged
)

#: Tag -> class, for every event in the union.
EVENT_TYPES: Final[dict[str, type[Event]]] = {
    cls.event_type(): cls
    for cls in (
        NodeInventory,
        NodeLost,
        NodeRecovered,
        NodeHeartbeat,
        DeviceHealthChanged,
        DeviceTaintChanged,
        AllocationRequested,
        AllocationDecided,
        AllocationReleased,
        ClaimPrepared,
        ClaimUnprepared,
        WorkloadStateChanged,
        NodeLost,
        NodeRecovered,
        AlertStateChanged,
    )
}

_decoder: Final[msgspec.json.Decoder[AnyEvent]] = msgspec.json.Decoder(AnyEvent)
_encoder: Final = msgspec.json.Encoder()


class DecodeError(ValueError):
    """A payload is not a known event; the message says which field or tag was wrong."""


def decode(payload: bytes) -> AnyEvent:
    """Decode one payload into its event Struct.

    Unknown fields are ignored so an older reader accepts a newer writer's payload. Every
    node name it carries must be a node name (:func:`check_node_name`), so no two nodes'
    events share a subject.
    """
    try:
        event = _decoder.decode(payload)
        _check_node_names(event)
        return event
    except msgspec.ValidationError as exc:
        raise DecodeError(f"event payload: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise DecodeError(f"event payload is not JSON: {exc}") from exc
    except UnicodeDecodeError as exc:
        # msgspec reports a string that is not UTF-8 this way, not as a DecodeError.
        raise DecodeError(f"event payload is not UTF-8 JSON: {exc}") from exc
    except ValueError as exc:
        raise DecodeError(f"event payload: {exc}") from exc


def _check_node_names(event: AnyEvent) -> None:
    """Raise ``ValueError`` naming the first field whose node name is not one."""
    node = getattr(event, "node", None)
    if isinstance(node, str):
        check_node_name(node, field="`$.node`")
    for i, name in enumerate(getattr(event, "nodes", ())):
        check_node_name(name, field=f"`$.nodes[{i}]`")
    for g, grant in enumerate(getattr(event, "grants", ())):
        for i, name in enumerate(grant.nodes):
            check_node_name(name, field=f"`$.grants[{g}].nodes[{i}]`")


def encode(event: Event) -> bytes:
    """Encode an event to its JSON payload (the ``type`` tag included)."""
    return _encoder.encode(event)
