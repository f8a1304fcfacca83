"""Reason codes: stable strings that Events, conditions and ``-o json`` carry (pure)."""

from __future__ import annotations

import enum

__all__ = ["ORDER", "Code"]


class Code(enum.StrEnum):
    NODE_NOT_READY = "NodeNotReady"
    NODE_UNSCHEDULABLE = "NodeUnschedulable"
    NODE_TAINT = "NodeTaint"
    NODE_SELECTOR = "NodeSelector"
    NO_POOL = "NoPool"
    POOL_INCOMPLETE = "PoolIncomplete"
    POOL_INVALID = "PoolInvalid"
    CLASS_SELECTOR = "ClassSelector"
    REQUEST_SELECTOR = "RequestSelector"
    DEVICES_HELD = "DevicesHeld"
    DEVICE_TAINTED = "DeviceTainted"
    COUNTER_SPENT = "CounterSpent"
    NOT_CONNECTED = "NotConnected"
    NOT_ENOUGH_DEVICES = "NotEnoughDevices"
    CLAIMS_CONFLICT = "ClaimsConflict"
    CLAIM_ON_OTHER_NODE = "ClaimOnOtherNode"
    CLAIM_IN_USE = "ClaimInUse"
    CLASS_MISSING = "ClassMissing"
    CLAIM_MISSING = "ClaimMissing"
    SCHEDULER_ERROR = "SchedulerError"
    CANNOT_EVALUATE = "CannotEvaluate"
    NOT_ULTRASERVER_OF_WORKLOAD = "NotUltraServerOfWorkload"


#: Which code speaks first when a node has several: what blocks the whole pod, then what a
#: user most likely changes (their selector, other claims holding devices), then the rest.
ORDER: dict[str, int] = {
    code: rank
    for rank, code in enumerate(
        (
            Code.SCHEDULER_ERROR,
            Code.CLASS_MISSING,
            Code.CLAIM_MISSING,
            Code.CLAIM_IN_USE,
            Code.CLAIM_ON_OTHER_NODE,
            Code.NODE_NOT_READY,
            Code.NODE_UNSCHEDULABLE,
            Code.NODE_SELECTOR,
            Code.NODE_TAINT,
            Code.NO_POOL,
            Code.POOL_INCOMPLETE,
            Code.POOL_INVALID,
            Code.NOT_ULTRASERVER_OF_WORKLOAD,
            Code.REQUEST_SELECTOR,
            Code.CLASS_SELECTOR,
            Code.DEVICES_HELD,
            Code.DEVICE_TAINTED,
            Code.COUNTER_SPENT,
            Code.NOT_CONNECTED,
            Code.NOT_ENOUGH_DEVICES,
            Code.CLAIMS_CONFLICT,
            Code.CANNOT_EVALUATE,
        )
    )
}
