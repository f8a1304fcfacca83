"""Who may publish and subscribe to what on the bus: one pure function per identity.

Everything is derived from the declarations (streams, durable consumers, the allocator's
request subject, the events' subjects), so a new stream or consumer changes the grants with
it. What the NATS client itself sends for JetStream:

- a JetStream publish is a core publish whose ack comes back on the client's inbox;
- a durable consumer is checked and created through ``$JS.API.CONSUMER.INFO`` /
  ``CONSUMER.CREATE.<stream>.<durable>[.<filter>]`` (an earlier release's pull consumer is
  replaced by the declare step, as only the admin deletes consumers), pushed to its deliver subject
  ``neuron.deliver.<stream>.<durable>`` in the deliver group ``<durable>`` (only its service
  may subscribe there, and only in that group) and acknowledged on
  ``$JS.ACK.<stream>.<durable>.>``;
- a projection or replay is an ordered push consumer: ``CONSUMER.CREATE.<stream>`` (no name,
  its filter is in the body, so reading is granted per stream), flow-control replies on
  ``$JS.FC.<stream>.>``, delivery to an inbox subject.

Replies (JetStream acks, the allocator's answers, ordered consumers' deliveries) come back on
the client's inbox. Each identity may subscribe only below its own prefix,
``_INBOX.<role>`` or ``_INBOX.<role>.<node>`` for a node agent (``inbox_prefix``, with which
every service connects), never ``_INBOX.>``: no identity reads another's replies.

Streams are declared by the admin identity only (``STREAM.CREATE/UPDATE/DELETE/PURGE``):
services keep calling ``Bus.reconcile`` at start, which only reads stream info when the
streams already match, so a service whose streams were declared starts as before and one
whose streams are missing or different fails at start with the server's permission
violation naming the stream, instead of changing them. The declare step is ``Bus.reconcile``
run once with the admin identity's token (an install Job, or the local stack's admin).
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec
from neuron_dra_common.bus.declarations import (
    ALERTS,
    ALIVE,
    ALLOCATION,
    AUDIT,
    CONSUMERS,
    DEAD_LETTER_PREFIX,
    DEADLETTER,
    HEALTH,
    HEARTBEAT,
    INVENTORY,
    PUBLISHER_SHARES,
    RPC_STREAM,
    STREAMS,
    TAINTS,
    ConsumerSpec,
    StreamSpec,
    deliver_subject,
    inbox_prefix,
    share_consumers,
)
from neuron_dra_common.events.base import SUBJECT_ROOT, subject_token

__all__ = [
    "ALLOCATOR_QUEUE",
    "ALLOCATOR_SUBJECT",
    "CLUSTER_SERVICES",
    "NODE_AGENTS",
    "ROLES",
    "ClusterService",
    "NodeAgent",
    "Permissions",
    "Role",
    "permissions_for",
]

NodeAgent = Literal["discovery", "health-probe", "kubelet-plugin", "device-plugin"]
ClusterService = Literal[
    "slice-publisher",
    "topology-allocator",
    "ultraserver-operator",
    "failure-detector",
    "alerts",
    "audit",
]
Role = Literal[NodeAgent, ClusterService, "reader", "admin"]

NODE_AGENTS: Final[tuple[NodeAgent, ...]] = (
    "discovery",
    "health-probe",
    "kubelet-plugin",
    "device-plugin",
)
CLUSTER_SERVICES: Final[tuple[ClusterService, ...]] = (
    "slice-publisher",
    "topology-allocator",
    "ultraserver-operator",
    "failure-detector",
    "alerts",
    "audit",
)
ROLES: Final[tuple[Role, ...]] = (*NODE_AGENTS, *CLUSTER_SERVICES, "reader", "admin")

# Spelled here rather than imported from the bus's rpc module, which loads the NATS client;
# tests/unit/busauth pins it to neuron_dra_common.bus.rpc.ALLOCATOR_SUBJECT.
ALLOCATOR_SUBJECT: Final = f"{SUBJECT_ROOT}.rpc.allocator"
#: The allocator's replicas share requests in this queue group; nobody else may join it.
ALLOCATOR_QUEUE: Final = "topology-allocator"

_API: Final = "$JS.API"


class Permissions(msgspec.Struct, frozen=True, kw_only=True):
    """NATS allow lists; ``publish_deny`` carves subjects out of ``publish`` (the server
    checks it first); ``respond`` lets the client answer requests it received (once each)."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    publish_deny: tuple[str, ...] = ()
    respond: bool = False


def _inbox(role: Role, node: str = "") -> str:
    """Every reply to ``role`` (on ``node``): its own inbox prefix, and nobody else's."""
    return f"{inbox_prefix(role, node=node)}.>"


def _subject(kind: str, *tokens: str) -> str:
    return ".".join((SUBJECT_ROOT, kind, *tokens))


def _read(*streams: StreamSpec) -> list[str]:
    """Ordered push consumers (projections, replays) on ``streams``."""
    grants: list[str] = []
    for stream in streams:
        grants += [
            f"{_API}.CONSUMER.CREATE.{stream.name}",
            f"{_API}.CONSUMER.INFO.{stream.name}.*",
            f"{_API}.STREAM.MSG.GET.{stream.name}",
            f"$JS.FC.{stream.name}.>",
        ]
    return grants


def _durable(spec: ConsumerSpec) -> list[str]:
    """A durable consumer: create or update it, acknowledge what it pushes."""
    at = f"{spec.stream}.{spec.durable}"
    return [
        f"{_API}.CONSUMER.INFO.{at}",
        f"{_API}.CONSUMER.CREATE.{at}",
        f"{_API}.CONSUMER.CREATE.{at}.>",
        f"{_API}.CONSUMER.DURABLE.CREATE.{at}",
        f"$JS.ACK.{at}.>",
    ]


def _deliveries(spec: ConsumerSpec) -> str:
    """Receiving ``spec``'s pushed messages: its deliver subject, in its group only."""
    return f"{deliver_subject(spec)} {spec.durable}"


def _dead_letters(*readers: tuple[StreamSpec | str, str]) -> list[str]:
    """Where the named readers file what they refuse (``neuron.deadletter.<stream>.<name>``)."""
    return [
        f"{DEAD_LETTER_PREFIX}.{stream if isinstance(stream, str) else stream.name}.{name}"
        for stream, name in readers
    ]


def _base() -> list[str]:
    # Every service checks the streams at start (Bus.reconcile reads their info).
    return [f"{_API}.INFO", *(f"{_API}.STREAM.INFO.{stream.name}" for stream in STREAMS)]


def _beats(token: str) -> list[str]:
    """A node's heartbeats: NodeHeartbeat (every beat, or hello and goodbye in ttl mode) and
    alive beats on NEURON_ALIVE, on its own subjects only."""
    return [_subject("heartbeat", token), _subject("alive", token)]


def _node_agent(role: NodeAgent, node: str) -> Permissions:
    token = subject_token(node)
    publish = _base()
    deny: tuple[str, ...] = ()
    if role == "discovery":
        publish += [_subject("inventory", token), *_beats(token)]
    elif role == "health-probe":
        # Its node's devices' health (neuron.health.<node>.<device>), never NodeLost or
        # NodeRecovered (neuron.health.<node>.node): only the failure detector declares those.
        publish += [_subject("health", token, "*"), *_read(HEALTH)]
        publish += _dead_letters((HEALTH, "health-probe"))
        deny = (_subject("health", token, "node"),)
    elif role == "device-plugin":
        # It reads its node's health events (to report devices Unhealthy to the kubelet) and,
        # on a node with no discovery agent, sends the node's heartbeats.
        publish += [*_beats(token), *_read(HEALTH)]
        publish += _dead_letters((HEALTH, "device-plugin-health"))
    else:
        publish += [
            _subject("claim", "prepared", token, ">"),
            _subject("claim", "unprepared", token, ">"),
            *_read(HEALTH),
            *_dead_letters((HEALTH, "kubelet-plugin-health")),
        ]
    return Permissions(publish=tuple(publish), subscribe=(_inbox(role, node),), publish_deny=deny)


def _cluster_service(role: ClusterService) -> Permissions:
    publish = _base()
    subscribe = [_inbox(role)]
    respond = False
    owned: list[str] = []  # the durable consumers it runs
    specs: list[ConsumerSpec] = []  # and those not declared by name
    if role == "slice-publisher":
        publish += [_subject("taint", ">"), *_read(INVENTORY, HEALTH, TAINTS)]
        # Its consumers for one share of the nodes, and those of each share when several
        # publishers share them (partitions).
        shares = [
            spec
            for n in range(1, PUBLISHER_SHARES + 1)
            for pair in share_consumers(n)
            for spec in pair
        ]
        specs += list({spec.durable: spec for spec in shares}.values())
        publish += _dead_letters(
            *((spec.stream, spec.durable) for spec in specs),
            (TAINTS, "slice-publisher-taints"),
        )
    elif role == "topology-allocator":
        publish += [_subject("allocation", ">"), *_read(INVENTORY, HEALTH, ALLOCATION)]
        publish += _dead_letters(
            (INVENTORY, "topology-allocator-inventory"),
            (HEALTH, "topology-allocator-health"),
            (ALLOCATION, "topology-allocator-allocations"),
            (RPC_STREAM, "topology-allocator-rpc"),
        )
        # Only the allocator answers its subject, and only in its own queue group.
        subscribe.append(f"{ALLOCATOR_SUBJECT} {ALLOCATOR_QUEUE}")
        respond = True
    elif role == "ultraserver-operator":
        publish += [ALLOCATOR_SUBJECT, _subject("workload", ">"), *_read(HEALTH)]
        publish += _dead_letters((HEALTH, "ultraserver-operator-health"))
    elif role == "failure-detector":
        # NodeLost / NodeRecovered only: neuron.health.<node>.node, never a device's health.
        publish += [_subject("health", "*", "node"), *_read(HEALTH, HEARTBEAT)]
        # Which nodes' alive beats NEURON_ALIVE holds (STREAM.INFO, in the base grants) and a
        # lost node's last one; nobody else reads that stream.
        publish.append(f"{_API}.STREAM.MSG.GET.{ALIVE.name}")
        owned.append("health-monitor-heartbeats")
        publish += _dead_letters(
            (HEALTH, "health-monitor-heartbeats"), (HEARTBEAT, "health-monitor-heartbeats")
        )
    elif role == "alerts":
        publish += [_subject("alert", ">"), *_read(ALERTS, ALLOCATION, DEADLETTER, AUDIT)]
        owned.append("alert")
        publish += _dead_letters(
            (AUDIT, "alert"), (ALERTS, "alert"), (ALLOCATION, "alert"), (DEADLETTER, "alert")
        )
    else:
        publish += _read(AUDIT)
        owned.append("audit")
        publish += _dead_letters((AUDIT, "audit"))
    for spec in [CONSUMERS[durable] for durable in owned] + specs:
        publish += _durable(spec)
        subscribe.append(_deliveries(spec))
    return Permissions(publish=tuple(publish), subscribe=tuple(subscribe), respond=respond)


def permissions_for(role: Role, *, node: str = "") -> Permissions:
    """The grants of ``role``; a node agent's are bound to ``node``.

    >>> permissions_for("discovery", node="ip-10-0-0-1.ec2.internal").publish[-2:]
    ('neuron.heartbeat.ip-10-0-0-1_ec2_internal', 'neuron.alive.ip-10-0-0-1_ec2_internal')
    """
    if role in NODE_AGENTS:
        if not node:
            raise ValueError(f"identity {role}: a node agent needs its node name")
        return _node_agent(role, node)
    if node:
        raise ValueError(f"identity {role}: only node agents are bound to a node (got {node!r})")
    if role == "admin":
        return Permissions(publish=(">",), subscribe=(">",), respond=True)
    if role == "reader":
        # Every stream but the alive beats, which only the failure detector reads.
        readable = [stream for stream in STREAMS if stream is not ALIVE]
        return Permissions(publish=(*_base(), *_read(*readable)), subscribe=(_inbox(role),))
    return _cluster_service(role)  # type: ignore[arg-type]
