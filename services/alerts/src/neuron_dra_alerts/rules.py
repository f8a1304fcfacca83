"""Which events fire or resolve which alert: one rule per event type, pure.

A rule looks at one event and answers with what the alert it is about should now be: firing
(with its labels and annotations) or resolved. It never sees the alert's current state; the
engine compares, records and sends. Labels are the ones Alertmanager routes and groups on:
``alertname``, ``severity``, ``node``, ``device``, ``workload``, ``namespace`` (a label
without a value is left out, as Alertmanager treats it as absent).

| event                   | fires                                            | resolves        |
|-------------------------|--------------------------------------------------|-----------------|
| DeviceHealthChanged     | ``NeuronDeviceUnhealthy`` (Unhealthy)            | Healthy         |
| NodeLost / NodeRecovered| ``NeuronNodeLost``                               | NodeRecovered   |
| WorkloadStateChanged    | ``NeuronWorkloadDegraded`` (Failed, partly       | Allocated, or   |
|                         | allocated, or back to Pending after holding      | Deallocating    |
|                         | capacity: waiting for a replacement)             | (deleted)       |
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final, Literal

import msgspec
from neuron_dra_common.events import (
    AnyEvent,
    DeviceHealthChanged,
    NodeLost,
    NodeRecovered,
    ObjectRef,
    WorkloadStateChanged,
)

__all__ = [
    "DEAD_LETTERS",
    "DEVICE_UNHEALTHY",
    "NODE_LOST",
    "RULES",
    "WORKLOAD_DEGRADED",
    "Desired",
    "dead_letters_alert",
    "evaluate",
]

DEVICE_UNHEALTHY: Final = "NeuronDeviceUnhealthy"
NODE_LOST: Final = "NeuronNodeLost"
WORKLOAD_DEGRADED: Final = "NeuronWorkloadDegraded"
DEAD_LETTERS: Final = "NeuronDeadLetters"

#: Who holds a node: the workload its UltraServer is allocated to, if any.
Holders = Mapping[str, ObjectRef]


class Desired(msgspec.Struct, frozen=True, kw_only=True):
    """What one alert should be after an event. A resolution carries only the key."""

    key: str
    alertname: str
    status: Literal["firing", "resolved"]
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    annotations: dict[str, str] = msgspec.field(default_factory=dict)


def _labels(**values: str) -> dict[str, str]:
    return {k: v for k, v in values.items() if v}


def _holder(holders: Holders, node: str) -> tuple[str, str]:
    ref = holders.get(node)
    return (ref.name, ref.namespace) if ref is not None else ("", "")


_DEVICE_RUNBOOK: Final = {
    "replace-instance": (
        "The error is not repairable on this instance. The device carries a NoExecute taint, "
        "so pods holding it were evicted and workloads with a failure strategy move to "
        "healthy capacity. Cordon and drain the node (kubectl drain {node} "
        "--ignore-daemonsets) and replace the instance."
    ),
    "reload-driver-or-reboot": (
        "A repairable memory error. Stop the workloads on {node}, then reload the Neuron "
        "driver or reboot the instance; the taint lifts and this alert resolves when the "
        "device reports healthy again."
    ),
}
_DEVICE_RUNBOOK_DEFAULT: Final = (
    "Look for NEURON_HW_ERR lines in the kernel log of {node} and at the device's error "
    "counters (neuron-monitor). The taint lifts and this alert resolves when the device "
    "reports healthy again."
)


def device_health(event: DeviceHealthChanged, holders: Holders) -> list[Desired]:
    key = f"{DEVICE_UNHEALTHY}/{event.node}/{event.device}"
    if event.health == "Healthy":
        return [Desired(key=key, alertname=DEVICE_UNHEALTHY, status="resolved")]
    if event.health != "Unhealthy":
        return []  # Unknown: nothing to say yet
    severity = "critical" if event.severity == "uncorrectable" else "warning"
    what = event.error_type or event.error_code or event.reason or "an error"
    workload, namespace = _holder(holders, event.node)
    detail = [event.reason] if event.reason else []
    if event.core is not None:
        detail.append(f"NeuronCore {event.core}")
    if event.evidence:
        detail.append(f"evidence: {event.evidence}")
    if workload:
        detail.append(f"the node is allocated to workload {namespace}/{workload}")
    runbook = _DEVICE_RUNBOOK.get(event.action, _DEVICE_RUNBOOK_DEFAULT).format(node=event.node)
    return [
        Desired(
            key=key,
            alertname=DEVICE_UNHEALTHY,
            status="firing",
            labels=_labels(
                alertname=DEVICE_UNHEALTHY,
                severity=severity,
                node=event.node,
                device=event.device,
                workload=workload,
                namespace=namespace,
            ),
            annotations=_labels(
                summary=f"Neuron device {event.device} on {event.node} is unhealthy: {what}"
                + (f" ({event.severity})" if event.severity else ""),
                description="; ".join(detail),
                runbook=runbook,
                action=event.action,
            ),
        )
    ]


def node_lost(event: NodeLost, holders: Holders) -> list[Desired]:
    workload, namespace = _holder(holders, event.node)
    since = (
        f" (last heartbeat {event.last_heartbeat_at.isoformat()})"
        if event.last_heartbeat_at is not None
        else ""
    )
    return [
        Desired(
            key=f"{NODE_LOST}/{event.node}",
            alertname=NODE_LOST,
            status="firing",
            labels=_labels(
                alertname=NODE_LOST,
                severity="critical",
                node=event.node,
                workload=workload,
                namespace=namespace,
            ),
            annotations=_labels(
                summary=f"Node {event.node} is lost: {event.reason}",
                description=f"Declared lost at {event.detected_at.isoformat()}{since}."
                + (f" It is allocated to workload {namespace}/{workload}." if workload else ""),
                runbook=(
                    f"Check the instance behind {event.node} in EC2 and its kubelet. Workloads "
                    "on it follow their failure strategy; this alert resolves when its "
                    "heartbeats resume."
                ),
            ),
        )
    ]


def node_recovered(event: NodeRecovered, holders: Holders) -> list[Desired]:
    return [Desired(key=f"{NODE_LOST}/{event.node}", alertname=NODE_LOST, status="resolved")]


#: Workload states that mean "holding what it asked for" or "going away": the alert resolves.
_WORKLOAD_FINE: Final = frozenset({"Allocated", "Deallocating"})
#: States that had capacity: falling back from one of them to Pending means waiting for a
#: replacement.
_HELD: Final = frozenset({"Allocated", "PartiallyAllocated"})


def workload_state(event: WorkloadStateChanged, holders: Holders) -> list[Desired]:
    ref = event.workload
    key = f"{WORKLOAD_DEGRADED}/{ref.namespace}/{ref.name}"
    if event.state in _WORKLOAD_FINE:
        return [Desired(key=key, alertname=WORKLOAD_DEGRADED, status="resolved")]
    if event.state == "Failed":
        severity, what = "critical", "failed"
    elif event.state == "PartiallyAllocated":
        severity, what = "warning", "only partly allocated"
    elif event.state == "Pending" and event.previous in _HELD:
        severity, what = "critical", "waiting for replacement capacity"
    else:
        return []  # Pending at first, Allocating: ordinary progress
    servers = ", ".join(event.ultraservers)
    return [
        Desired(
            key=key,
            alertname=WORKLOAD_DEGRADED,
            status="firing",
            labels=_labels(
                alertname=WORKLOAD_DEGRADED,
                severity=severity,
                workload=ref.name,
                namespace=ref.namespace,
            ),
            annotations=_labels(
                summary=f"NeuronUltraServerWorkload {ref.namespace}/{ref.name} is {what}",
                description=f"State {event.state} (was {event.previous or 'unknown'})"
                + (f": {event.reason}" if event.reason else "")
                + (f"; UltraServers {servers}" if servers else ""),
                runbook=(
                    f"kubectl describe nusw -n {ref.namespace} {ref.name} shows its conditions "
                    "and Events; kubectl get nus -n neuron-dra-driver shows free UltraServers. "
                    "It recovers by itself when healthy capacity appears; this alert resolves "
                    "when it is Allocated again."
                ),
            ),
        )
    ]


Rule = Callable[[AnyEvent, Holders], list[Desired]]

#: The rule of each event type (by tag); events of other types never touch an alert.
RULES: Final[dict[str, Rule]] = {
    DeviceHealthChanged.event_type(): device_health,  # type: ignore[dict-item]
    NodeLost.event_type(): node_lost,  # type: ignore[dict-item]
    NodeRecovered.event_type(): node_recovered,  # type: ignore[dict-item]
    WorkloadStateChanged.event_type(): workload_state,  # type: ignore[dict-item]
}


def evaluate(event: AnyEvent, holders: Holders) -> list[Desired]:
    """What ``event`` means for the alerts it is about (empty: nothing)."""
    rule = RULES.get(event.event_type())
    return rule(event, holders) if rule is not None else []


def dead_letters_alert(*, count: int, stream: str) -> Desired:
    """Firing while messages keep arriving in the dead-letter stream."""
    return Desired(
        key=DEAD_LETTERS,
        alertname=DEAD_LETTERS,
        status="firing",
        labels=_labels(alertname=DEAD_LETTERS, severity="warning"),
        annotations=_labels(
            summary=f"{count} new message(s) in {stream}",
            description=(
                "A consumer could not decode or handle these messages; each one is kept with "
                "the reason in its x-dead-letter-reason header."
            ),
            runbook=(
                f"Read them with `nats stream view {stream}` (or the bus's read_dead_letter) "
                "and fix what the reason names (an old or foreign publisher, a failing "
                "dependency); this alert resolves after a quiet spell."
            ),
        ),
    )
