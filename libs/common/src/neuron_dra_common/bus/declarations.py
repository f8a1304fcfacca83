"""Every stream and durable consumer of the product, declared in one place.

Subjects are ``neuron.<kind>.<...>``; each event's ``subject`` property says which. A service
reconciles all streams (cheap and idempotent) and the consumers it runs.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from neuron_dra_common.events.base import SUBJECT_ROOT, subject_token

__all__ = [
    "ALERTS",
    "ALIVE",
    "ALLOCATION",
    "AUDIT",
    "CLAIMS",
    "CONSUMERS",
    "DEADLETTER",
    "DEAD_LETTER_PREFIX",
    "DELIVER_PREFIX",
    "HEALTH",
    "HEARTBEAT",
    "INBOX_ROOT",
    "INVENTORY",
    "INVENTORY_BUCKETS",
    "PUBLISHER_SHARES",
    "RPC_STREAM",
    "STREAMS",
    "TAINTS",
    "WORKLOADS",
    "ConsumerSpec",
    "StreamSpec",
    "consumer",
    "dead_letter_subject",
    "deliver_subject",
    "inbox_prefix",
    "inventory_partition",
    "published_subject",
    "reader",
    "share_consumers",
]

_DAY = 86_400.0


class StreamSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What a stream should look like; reconciliation makes the server match it.

    ``sources`` names other streams whose messages this one also holds (the audit view).
    ``max_age_seconds`` 0 keeps messages until another limit removes them.
    ``allow_msg_ttl`` lets a publisher give one message its own lifetime (the ``Nats-TTL``
    header, whole seconds; NATS 2.11 and later): the server removes it when that runs out.
    """

    name: str
    subjects: tuple[str, ...] = ()
    description: str = ""
    max_age_seconds: float = 0.0
    max_msgs_per_subject: int = -1
    max_bytes: int = -1
    duplicate_window_seconds: float = 120.0
    storage: Literal["file", "memory"] = "file"
    replicas: int = 1
    sources: tuple[str, ...] = ()
    #: ``(source, destination)`` of the server's subject transform of what comes in, if any.
    subject_transform: tuple[str, str] | None = None
    allow_msg_ttl: bool = False


class ConsumerSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A durable consumer on ``stream``, pushed to its service's instances as one group.

    The server pushes to :func:`deliver_subject` (no stream stores it) in the deliver group
    named ``durable``, so the instances of one service share the messages and at most
    ``max_ack_pending`` of them are unacknowledged at a time. That bound is also what waits
    in a runner's inbox: with 500, handlers of up to 60 ms each finish a full inbox within
    the ack wait, so no message is redelivered while it waits its turn.

    ``ack_wait_seconds`` is how long the server waits for an ack before redelivering; the
    runner sends in-progress acks well within it while a handler is slow. ``max_deliver`` is
    left unlimited on the server on purpose: the runner bounds attempts itself and sends a
    message that keeps failing to the dead letter, so the server never drops one silently.
    """

    stream: str
    durable: str
    filter_subjects: tuple[str, ...] = ()
    description: str = ""
    ack_wait_seconds: float = 30.0
    max_ack_pending: int = 500
    deliver_policy: Literal["all", "new", "last_per_subject"] = "all"


def _subjects(kind: str) -> tuple[str, ...]:
    return (f"{SUBJECT_ROOT}.{kind}.>",)


DEAD_LETTER_PREFIX: Final = f"{SUBJECT_ROOT}.deadletter"
DELIVER_PREFIX: Final = f"{SUBJECT_ROOT}.deliver"

#: The server files each node's inventory under one of this many buckets, by a hash of the
#: node's subject token (``neuron.inventory.<bucket>.<token>``), so that several slice
#: publishers can each consume a fixed share of the nodes (``partitions``).
INVENTORY_BUCKETS: Final = 16

INVENTORY: Final = StreamSpec(
    name="NEURON_INVENTORY",
    subjects=_subjects("inventory"),
    description="Latest NodeInventory per node",
    max_msgs_per_subject=1,
    subject_transform=(
        f"{SUBJECT_ROOT}.inventory.*",
        f"{SUBJECT_ROOT}.inventory.{{{{partition({INVENTORY_BUCKETS},1)}}}}.{{{{wildcard(1)}}}}",
    ),
)
HEARTBEAT: Final = StreamSpec(
    name="NEURON_HEARTBEAT",
    subjects=_subjects("heartbeat"),
    description="Latest NodeHeartbeat per node",
    max_msgs_per_subject=1,
    max_age_seconds=_DAY,
)
#: Agents in ``ttl`` heartbeat mode beat here (``neuron.alive.<node token>``): a message with
#: no body whose ``Nats-TTL`` is the node's window. The server drops it when that runs out,
#: so the subjects the stream holds are the nodes alive now; the failure detector asks for
#: them once a second instead of consuming every beat. Not in AUDIT, like heartbeats.
ALIVE: Final = StreamSpec(
    name="NEURON_ALIVE",
    subjects=(f"{SUBJECT_ROOT}.alive.*",),
    description="Each node's last alive beat, kept for its own Nats-TTL",
    max_msgs_per_subject=1,
    max_age_seconds=60.0,
    duplicate_window_seconds=5.0,
    allow_msg_ttl=True,
)
HEALTH: Final = StreamSpec(
    name="NEURON_HEALTH",
    subjects=_subjects("health"),
    description="Device health changes",
    max_age_seconds=30 * _DAY,
)
TAINTS: Final = StreamSpec(
    name="NEURON_TAINTS",
    subjects=_subjects("taint"),
    description="Device taints set and cleared by the slice publisher",
    max_age_seconds=30 * _DAY,
)
ALLOCATION: Final = StreamSpec(
    name="NEURON_ALLOCATION",
    subjects=_subjects("allocation"),
    description="Allocation requests and decisions",
    max_age_seconds=30 * _DAY,
)
CLAIMS: Final = StreamSpec(
    name="NEURON_CLAIMS",
    subjects=_subjects("claim"),
    description="Claim preparations and releases",
    max_age_seconds=30 * _DAY,
)
WORKLOADS: Final = StreamSpec(
    name="NEURON_WORKLOADS",
    subjects=_subjects("workload"),
    description="Workload state changes",
    max_age_seconds=30 * _DAY,
)
ALERTS: Final = StreamSpec(
    name="NEURON_ALERTS",
    subjects=_subjects("alert"),
    description="Latest state of each alert the alerts service sent (firing or resolved)",
    max_msgs_per_subject=1,
    max_age_seconds=90 * _DAY,
)
AUDIT: Final = StreamSpec(
    name="NEURON_AUDIT",
    description="Every decision of every stream except heartbeats, for audit and replay",
    max_age_seconds=90 * _DAY,
    sources=(
        INVENTORY.name,
        HEALTH.name,
        TAINTS.name,
        ALLOCATION.name,
        CLAIMS.name,
        WORKLOADS.name,
        ALERTS.name,
    ),
)
DEADLETTER: Final = StreamSpec(
    name="NEURON_DEADLETTER",
    subjects=(f"{DEAD_LETTER_PREFIX}.>",),
    description="Messages a consumer could not decode or handle, with the reason",
    max_age_seconds=90 * _DAY,
    # A projection reads its stream again at every start and refuses the same message again:
    # remembering dead-letter ids for as long as they are kept stores each one once.
    duplicate_window_seconds=90 * _DAY,
)

#: All streams, in an order where a sourced stream exists before the one sourcing it.
STREAMS: Final[tuple[StreamSpec, ...]] = (
    INVENTORY,
    HEARTBEAT,
    ALIVE,
    HEALTH,
    TAINTS,
    ALLOCATION,
    CLAIMS,
    WORKLOADS,
    ALERTS,
    AUDIT,
    DEADLETTER,
)


#: The durable consumers of the product's services, by durable name: each one is run by
#: the service named in it, through :class:`~neuron_dra_common.bus.ConsumerRunner`.
CONSUMERS: Final[dict[str, ConsumerSpec]] = {
    spec.durable: spec
    for spec in (
        ConsumerSpec(stream=INVENTORY.name, durable="slice-publisher-inventory"),
        ConsumerSpec(stream=HEALTH.name, durable="slice-publisher-health"),
        ConsumerSpec(stream=HEARTBEAT.name, durable="health-monitor-heartbeats"),
        ConsumerSpec(stream=AUDIT.name, durable="audit"),
        ConsumerSpec(stream=AUDIT.name, durable="alert"),
    )
}


def inventory_partition(partition: int, partitions: int) -> tuple[str, ...]:
    """The inventory subjects of ``partition`` (from 0) of ``partitions``: the buckets whose
    number leaves ``partition`` when divided by ``partitions``; all of them for one partition.

    >>> inventory_partition(1, 8)
    ('neuron.inventory.1.*', 'neuron.inventory.9.*')
    """
    if not 0 <= partition < partitions <= INVENTORY_BUCKETS:
        raise ValueError(f"partition {partition} of {partitions} (at most {INVENTORY_BUCKETS})")
    if partitions == 1:
        return INVENTORY.subjects
    return tuple(
        f"{SUBJECT_ROOT}.inventory.{bucket}.*"
        for bucket in range(partition, INVENTORY_BUCKETS, partitions)
    )


def published_subject(stored: str) -> str:
    """The subject a message was published on, from the one the stream stored it under: an
    inventory without its bucket (the server put it there, see :data:`INVENTORY`).

    >>> published_subject("neuron.inventory.7.ip-10-0-0-1_ec2_internal")
    'neuron.inventory.ip-10-0-0-1_ec2_internal'
    """
    if not stored.startswith(_INVENTORY_PREFIX):
        return stored
    bucket, _, token = stored[len(_INVENTORY_PREFIX) :].partition(".")
    if token and "." not in token and bucket.isdigit() and int(bucket) < INVENTORY_BUCKETS:
        return _INVENTORY_PREFIX + token
    return stored


_INVENTORY_PREFIX: Final = f"{SUBJECT_ROOT}.inventory."

#: At most this many slice publishers share the nodes (``partitions``), each share with
#: its own two durable consumers (:func:`share_consumers`).
PUBLISHER_SHARES: Final = 4


def share_consumers(partitions: int) -> list[tuple[ConsumerSpec, ConsumerSpec]]:
    """The slice publisher's inventory and health consumers of each share: the two declared
    ones for a single share.

    >>> [c.durable for c in share_consumers(2)[1]]
    ['slice-publisher-inventory-1', 'slice-publisher-health-1']
    """
    if partitions == 1:
        return [(CONSUMERS["slice-publisher-inventory"], CONSUMERS["slice-publisher-health"])]
    return [
        (
            ConsumerSpec(
                stream=INVENTORY.name,
                durable=f"slice-publisher-inventory-{p}",
                filter_subjects=inventory_partition(p, partitions),
            ),
            ConsumerSpec(stream=HEALTH.name, durable=f"slice-publisher-health-{p}"),
        )
        for p in range(partitions)
    ]


#: The stream-like name under which a request responder's dead letters are filed (requests
#: are core NATS messages, stored in no stream).
RPC_STREAM: Final = "RPC"


def consumer(durable: str) -> ConsumerSpec:
    """The declared consumer named ``durable``; the error lists the known names."""
    try:
        return CONSUMERS[durable]
    except KeyError:
        known = ", ".join(sorted(CONSUMERS))
        raise KeyError(f"consumer {durable!r} is not declared; known: {known}") from None


def reader(stream: StreamSpec | str, name: str) -> ConsumerSpec:
    """The identity of a consumer that is not durable (a projection, a replay, a responder).

    It names where that reader's dead letters go; nothing is created on the server for it.

    >>> dead_letter_subject(reader(INVENTORY, "topology-allocator-inventory"))
    'neuron.deadletter.NEURON_INVENTORY.topology-allocator-inventory'
    """
    return ConsumerSpec(stream=stream if isinstance(stream, str) else stream.name, durable=name)


def dead_letter_subject(spec: ConsumerSpec) -> str:
    """Where ``spec``'s consumer sends what it cannot handle."""
    return f"{DEAD_LETTER_PREFIX}.{spec.stream}.{spec.durable}"


def deliver_subject(spec: ConsumerSpec) -> str:
    """Where the server pushes ``spec``'s messages; only its service may subscribe to it.

    >>> deliver_subject(consumer("audit"))
    'neuron.deliver.NEURON_AUDIT.audit'
    """
    return f"{DELIVER_PREFIX}.{spec.stream}.{spec.durable}"


#: Replies (JetStream acks, answers to requests, ordered consumers' deliveries) come back on
#: subjects under this root; each identity receives them only under its own prefix.
INBOX_ROOT: Final = "_INBOX"


def inbox_prefix(identity: str, *, node: str = "") -> str:
    """The reply inbox prefix of ``identity`` (a bus role), and of its node for a node agent.

    The auth callout lets an identity subscribe only below this prefix, so no client reads
    another's replies; every service connects with it (``Bus.connect(inbox=...)``).

    >>> inbox_prefix("discovery", node="ip-10-0-0-1.ec2.internal")
    '_INBOX.discovery.ip-10-0-0-1_ec2_internal'
    >>> inbox_prefix("topology-allocator")
    '_INBOX.topology-allocator'
    """
    if not identity or subject_token(identity) != identity:
        raise ValueError(f"inbox prefix: identity {identity!r} is not one subject token")
    if node:
        return f"{INBOX_ROOT}.{identity}.{subject_token(node)}"
    return f"{INBOX_ROOT}.{identity}"
