"""Make the server's streams and consumers match the declarations, idempotently."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable
from typing import Any, Literal

import msgspec
import nats.errors
from nats.js import JetStreamContext, api
from nats.js.errors import BadRequestError, NotFoundError

from neuron_dra_common.bus.declarations import ConsumerSpec, StreamSpec, deliver_subject

__all__ = [
    "Change",
    "consumer_config",
    "reconcile",
    "reconcile_consumer",
    "reconcile_stream",
    "replace_pull_consumers",
]

log = logging.getLogger(__name__)

Change = Literal["created", "updated", "recreated", "unchanged"]

_DELIVER = {
    "all": api.DeliverPolicy.ALL,
    "new": api.DeliverPolicy.NEW,
    "last_per_subject": api.DeliverPolicy.LAST_PER_SUBJECT,
}


def _stream_config(spec: StreamSpec) -> api.StreamConfig:
    return api.StreamConfig(
        name=spec.name,
        description=spec.description or None,
        subjects=list(spec.subjects) or None,
        retention=api.RetentionPolicy.LIMITS,
        storage=api.StorageType(spec.storage),
        max_age=spec.max_age_seconds,
        max_msgs_per_subject=spec.max_msgs_per_subject,
        max_bytes=spec.max_bytes,
        duplicate_window=spec.duplicate_window_seconds,
        num_replicas=spec.replicas,
        sources=[api.StreamSource(name=name) for name in spec.sources] or None,
        subject_transform=api.SubjectTransform(*spec.subject_transform)
        if spec.subject_transform
        else None,
        allow_msg_ttl=spec.allow_msg_ttl or None,
    )


def _stream_view(config: api.StreamConfig) -> dict[str, Any]:
    # Only what a StreamSpec can say; server defaults elsewhere are left alone.
    return {
        "description": config.description or "",
        "subjects": sorted(config.subjects or ()),
        "storage": api.StorageType(config.storage).value if config.storage else "file",
        "max_age": float(config.max_age or 0),
        "max_msgs_per_subject": config.max_msgs_per_subject,
        "max_bytes": config.max_bytes if config.max_bytes is not None else -1,
        "duplicate_window": float(config.duplicate_window or 0),
        "num_replicas": config.num_replicas or 1,
        "sources": sorted(s.name for s in config.sources or ()),
        "subject_transform": (config.subject_transform.src, config.subject_transform.dest)
        if config.subject_transform
        else None,
        "allow_msg_ttl": bool(config.allow_msg_ttl),
    }


def consumer_config(spec: ConsumerSpec) -> api.ConsumerConfig:
    """The server's form of ``spec``: push to its deliver subject, in a group of its name."""
    filters = list(spec.filter_subjects)
    return api.ConsumerConfig(
        name=spec.durable,
        durable_name=spec.durable,
        description=spec.description or None,
        deliver_subject=deliver_subject(spec),
        deliver_group=spec.durable,
        deliver_policy=_DELIVER[spec.deliver_policy],
        ack_policy=api.AckPolicy.EXPLICIT,
        ack_wait=spec.ack_wait_seconds,
        max_deliver=-1,
        max_ack_pending=spec.max_ack_pending,
        filter_subject=filters[0] if len(filters) == 1 else None,
        filter_subjects=filters if len(filters) > 1 else None,
    )


def _consumer_view(config: api.ConsumerConfig) -> dict[str, Any]:
    filters = list(config.filter_subjects or ())
    if config.filter_subject:
        filters.append(config.filter_subject)
    return {
        "description": config.description or "",
        "deliver_subject": config.deliver_subject or "",
        "deliver_group": config.deliver_group or "",
        "deliver_policy": api.DeliverPolicy(config.deliver_policy).value
        if config.deliver_policy
        else "all",
        "ack_wait": float(config.ack_wait or 0),
        "max_ack_pending": config.max_ack_pending,
        "filters": sorted(filters),
    }


async def reconcile_stream(js: JetStreamContext, spec: StreamSpec) -> Change:
    """Create ``spec``'s stream, or update it if the server's differs; otherwise do nothing.

    Replicas only ever grow: how many copies a stream keeps is a property of the NATS
    cluster (``NEURON_DRA_STREAM_REPLICAS``), so a process configured for fewer never takes
    copies away from a stream another raised.
    """
    desired = _stream_config(spec)
    try:
        info = await js.stream_info(spec.name)
    except NotFoundError:
        await js.add_stream(desired)
        log.info("stream created", extra={"stream": spec.name, "replicas": spec.replicas})
        return "created"
    desired.num_replicas = max(spec.replicas, info.config.num_replicas or 1)
    if _stream_view(info.config) == _stream_view(desired):
        return "unchanged"
    await js.update_stream(desired)
    log.info("stream updated", extra={"stream": spec.name})
    if spec.subject_transform and _stream_view(info.config)["subject_transform"] is None:
        await _transform_stored(js, spec.name, spec.subject_transform[0])
    return "updated"


#: JetStream's answer to a publish whose expected last sequence of its subject is not so.
_WRONG_LAST_SEQUENCE = 10071


async def _transform_stored(js: JetStreamContext, stream: str, source: str) -> None:
    """Store again, through the subject transform just given to ``stream``, the latest message
    of each subject matching ``source`` (stored before it); then delete the old copy.

    Each goes back to its own subject with its headers (less its message id, which the
    duplicate window would drop) and only if its new subject holds nothing yet, so a message
    published since is never replaced by an older one.
    """
    info = await js.stream_info(stream, subjects_filter=source)
    moved = 0
    for subject in sorted(info.state.subjects or {}):
        msg = await js.get_last_msg(stream, subject)
        headers = {k: v for k, v in (msg.headers or {}).items() if k != "Nats-Msg-Id"}
        headers["Nats-Expected-Last-Subject-Sequence"] = "0"
        try:
            await js.publish(subject, msg.data or b"", stream=stream, headers=headers)
            moved += 1
        except BadRequestError as exc:
            if exc.err_code != _WRONG_LAST_SEQUENCE:
                raise  # a newer message is there already: only the old copy goes
        if msg.seq is not None:
            with contextlib.suppress(NotFoundError):
                await js.delete_msg(stream, msg.seq)
    log.info("stored messages transformed", extra={"stream": stream, "moved": moved})


async def _recreate(js: JetStreamContext, spec: ConsumerSpec, info: api.ConsumerInfo) -> None:
    """Replace a pull consumer of ``spec``'s name with the push one, from where it stood.

    The server turns no pull consumer into a push one, so the old one is deleted and the new
    one starts after the old one's ack floor: nothing it had not acknowledged is skipped.
    What it had acknowledged beyond the floor (after a retried message) comes again, once;
    handlers are idempotent across processes (:class:`~.runner.Delivery`).
    """
    desired = consumer_config(spec)
    floor = info.ack_floor.stream_seq if info.ack_floor and info.ack_floor.stream_seq else 0
    if floor:
        desired.deliver_policy = api.DeliverPolicy.BY_START_SEQUENCE
        desired.opt_start_seq = floor + 1
    try:
        await js.delete_consumer(spec.stream, spec.durable)
    except nats.errors.Error as exc:
        # With the auth callout only the admin deletes consumers.
        raise RuntimeError(
            f"consumer {spec.stream}/{spec.durable} is an earlier release's pull consumer and "
            f"could not be replaced ({exc or type(exc).__name__}); run the declare step "
            "(neuron-dra-bus-declare) with the bus's admin identity"
        ) from None
    await js.add_consumer(spec.stream, desired)
    log.warning(
        "pull consumer replaced by a push consumer",
        extra={"stream": spec.stream, "consumer": spec.durable, "from_sequence": floor + 1},
    )


async def reconcile_consumer(js: JetStreamContext, spec: ConsumerSpec) -> Change:
    """Create ``spec``'s durable consumer, or update it in place if its definition changed.

    A pull consumer of the same name (an earlier release's) is recreated as a push consumer
    from its ack floor.
    """
    desired = consumer_config(spec)
    try:
        info = await js.consumer_info(spec.stream, spec.durable)
    except NotFoundError:
        await js.add_consumer(spec.stream, desired)
        log.info("consumer created", extra={"stream": spec.stream, "consumer": spec.durable})
        return "created"
    if not info.config.deliver_subject:
        await _recreate(js, spec, info)
        return "recreated"
    if info.config.deliver_policy == api.DeliverPolicy.BY_START_SEQUENCE:
        # Recreated from where its predecessor stood (see _recreate): where it started is
        # history, not a difference to mend, and the server would refuse to change it.
        desired.deliver_policy = info.config.deliver_policy
        desired.opt_start_seq = info.config.opt_start_seq
    if _consumer_view(info.config) == _consumer_view(desired):
        return "unchanged"
    # The create call without an action is create-or-update on the server: same durable,
    # same delivery state, new settings.
    await js.add_consumer(spec.stream, desired)
    log.info("consumer updated", extra={"stream": spec.stream, "consumer": spec.durable})
    return "updated"


async def replace_pull_consumers(
    js: JetStreamContext, specs: Iterable[ConsumerSpec]
) -> dict[str, Change]:
    """Replace the pull consumers an earlier release left under ``specs``' names (see
    :func:`_recreate`); consumers that do not exist are left for their services to create."""
    changes: dict[str, Change] = {}
    for spec in specs:
        try:
            info = await js.consumer_info(spec.stream, spec.durable)
        except NotFoundError:
            continue
        if not info.config.deliver_subject:
            await _recreate(js, spec, info)
            changes[f"{spec.stream}/{spec.durable}"] = "recreated"
    return changes


async def reconcile(
    js: JetStreamContext,
    *,
    streams: Iterable[StreamSpec],
    consumers: Iterable[ConsumerSpec] = (),
    replicas: int = 1,
) -> dict[str, Change]:
    """Reconcile streams first (in order), then consumers; returns what happened per name.

    ``replicas`` is the least number of copies of each stream (the NATS cluster's size, up
    to 5); a declaration asking for more keeps its own.
    """
    changes: dict[str, Change] = {}
    for stream in streams:
        if replicas > stream.replicas:
            stream = msgspec.structs.replace(stream, replicas=replicas)
        changes[stream.name] = await reconcile_stream(js, stream)
    for spec in consumers:
        changes[f"{spec.stream}/{spec.durable}"] = await reconcile_consumer(js, spec)
    return changes
