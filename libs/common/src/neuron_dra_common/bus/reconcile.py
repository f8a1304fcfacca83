"""Make the server's streams and consumers match the declarations, idempotently."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Literal

import msgspec
from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError

from neuron_dra_common.bus.declarations import ConsumerSpec, StreamSpec

__all__ = ["Change", "reconcile", "reconcile_consumer", "reconcile_stream"]

log = logging.getLogger(__name__)

Change = Literal["created", "updated", "unchanged"]

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
    }


def _consumer_config(spec: ConsumerSpec) -> api.ConsumerConfig:
    filters = list(spec.filter_subjects)
    return api.ConsumerConfig(
        name=spec.durable,
        durable_name=spec.durable,
        description=spec.description or None,
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
    return "updated"


async def reconcile_consumer(js: JetStreamContext, spec: ConsumerSpec) -> Change:
    """Create ``spec``'s durable consumer, or update it in place if its definition changed."""
    desired = _consumer_config(spec)
    try:
        info = await js.consumer_info(spec.stream, spec.durable)
    except NotFoundError:
        await js.add_consumer(spec.stream, desired)
        log.info("consumer created", extra={"stream": spec.stream, "consumer": spec.durable})
        return "created"
    if _consumer_view(info.config) == _consumer_view(desired):
        return "unchanged"
    # The create call without an action is create-or-update on the server: same durable,
    # same delivery state, new settings.
    await js.add_consumer(spec.stream, desired)
    log.info("consumer updated", extra={"stream": spec.stream, "consumer": spec.durable})
    return "updated"


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
