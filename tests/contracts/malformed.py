"""Malformed messages every consumer must refuse, each with what its dead letter must say.

Built from a consumer's own sample events, so each lands on a subject the consumer reads:
bytes that are not an event, a valid event of the wrong type for the subject, a message over
the size limit, a body about another node or object than its subject, and (for inventory
readers) an inventory with more devices than a host can have. Each case uses its own sample
index, so streams that keep one message per subject keep all of them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import msgspec
from neuron_dra_common.bus import DeadLetterRecord, IntakeLimits
from neuron_dra_common.events import (
    AlertStateChanged,
    DeviceHealthChanged,
    Event,
    NodeHeartbeat,
    NodeInventory,
    encode,
)
from neuron_dra_common.hardware.model import NeuronDevice

from tests.contracts.support import heartbeat

__all__ = ["Malformed", "check_dead_letters", "malformed_inputs"]

#: Small enough that an oversized message is cheap to publish, large enough for any sample.
CONTRACT_LIMITS = IntakeLimits(max_message_bytes=64 * 1024)


class Malformed(NamedTuple):
    """One message a consumer must refuse: where it goes, what it is, what the reason says."""

    what: str
    subject: str
    payload: bytes
    kind: str
    reason: str


def _other_type(event: Event, index: int) -> Event:
    """A valid event of another type than ``event``, distinct for each ``index``."""
    if isinstance(event, NodeHeartbeat):
        return DeviceHealthChanged(node=f"other-{index}", device="neurondevice0", health="Healthy")
    return heartbeat(f"other-{index}")


def _elsewhere(event: Event) -> Event:
    """``event`` about another node (or, for events without one, another alert or workload)."""
    if hasattr(event, "node"):
        return msgspec.structs.replace(event, node=f"{event.node}-elsewhere")
    if isinstance(event, AlertStateChanged):
        return msgspec.structs.replace(event, key=f"{event.key}-elsewhere")
    workload = event.workload  # type: ignore[attr-defined]
    moved = msgspec.structs.replace(workload, name=f"{workload.name}-elsewhere")
    return msgspec.structs.replace(event, workload=moved)


def malformed_inputs(
    sample: Callable[[int], Event], *, first: int, limits: IntakeLimits = CONTRACT_LIMITS
) -> list[Malformed]:
    """The malformed messages for a consumer whose good events ``sample(i)`` builds."""
    undecodable, wrong, large, moved = (sample(first + i) for i in range(4))
    other = _other_type(wrong, first)
    padded = msgspec.json.decode(encode(large))
    padded["padding"] = "x" * limits.max_message_bytes
    body = _elsewhere(moved)
    cases = [
        Malformed(
            "undecodable",
            undecodable.subject,
            b"\xff\xfe not an event %d" % first,
            "decode",
            "not JSON",
        ),
        Malformed(
            "wrong type",
            wrong.subject,
            encode(other),
            "refused",
            f"{other.event_type()} on {wrong.subject}: its body belongs on {other.subject}",
        ),
        Malformed(
            "oversized",
            large.subject,
            msgspec.json.encode(padded),
            "refused",
            f"over the limit of {limits.max_message_bytes} bytes",
        ),
        Malformed(
            "subject/body mismatch",
            moved.subject,
            encode(body),
            "refused",
            f"on {moved.subject}: its body belongs on {body.subject}",
        ),
    ]
    crowded = sample(first + 4)
    if isinstance(crowded, NodeInventory):
        devices = tuple(NeuronDevice(index=i) for i in range(limits.max_inventory_devices + 1))
        hardware = msgspec.structs.replace(crowded.hardware, devices=devices)
        cases.append(
            Malformed(
                "too many devices",
                crowded.subject,
                encode(msgspec.structs.replace(crowded, hardware=hardware)),
                "refused",
                f"hardware.devices has {len(devices)} devices, over the limit of "
                f"{limits.max_inventory_devices}",
            )
        )
    return cases


def check_dead_letters(
    records: Sequence[DeadLetterRecord], cases: Sequence[Malformed], *, consumer: str
) -> None:
    """Exactly one dead letter of ``consumer`` per case, each with its kind and reason."""
    mine = [r for r in records if r.consumer == consumer]
    assert len(mine) == len(cases), (
        f"{consumer}: {len(cases)} malformed messages, {len(mine)} dead letters: "
        f"{[r.reason for r in mine]}"
    )
    by_payload = {r.payload: r for r in mine}
    for case in cases:
        record = by_payload.get(case.payload)
        assert record is not None, f"{consumer}: no dead letter for the {case.what} message"
        assert (record.kind, record.subject) == (case.kind, case.subject), case.what
        assert case.reason in record.reason, f"{case.what}: {record.reason!r}"
