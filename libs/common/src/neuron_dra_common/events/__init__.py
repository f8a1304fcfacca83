"""Event catalog: versioned, frozen msgspec Structs decoded as one tagged union."""

from neuron_dra_common.events.base import SUBJECT_ROOT, Event, subject_token
from neuron_dra_common.events.catalog import (
    AllocationDecided,
    AllocationReleased,
    AllocationRequested,
    ClaimPrepared,
    ClaimUnprepared,
    DeviceHealth,
    DeviceHealthChanged,
    NodeHeartbeat,
    NodeInventory,
    NodeLost,
    NodeRecovered,
    ObjectRef,
    UltraServerGrant,
    UltraServerRefusal,
    WorkloadStateChanged,
)
from neuron_dra_common.events.codec import EVENT_TYPES, AnyEvent, DecodeError, decode, encode

__all__ = [
    "EVENT_TYPES",
    "SUBJECT_ROOT",
    "AllocationDecided",
    "AllocationReleased",
    "AllocationRequested",
    "AnyEvent",
    "ClaimPrepared",
    "ClaimUnprepared",
    "DecodeError",
    "DeviceHealth",
    "DeviceHealthChanged",
    "Event",
    "NodeHeartbeat",
    "NodeInventory",
    "NodeLost",
    "NodeRecovered",
    "ObjectRef",
    "UltraServerGrant",
    "UltraServerRefusal",
    "WorkloadStateChanged",
    "decode",
    "encode",
    "subject_token",
]
