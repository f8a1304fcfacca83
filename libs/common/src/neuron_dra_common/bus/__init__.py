"""The only module of common that talks to NATS: streams, publishing, consumer runners."""

from neuron_dra_common.bus.connection import Bus
from neuron_dra_common.bus.deadletter import DeadLetterRecord, read_dead_letter
from neuron_dra_common.bus.declarations import (
    CONSUMERS,
    DEAD_LETTER_PREFIX,
    STREAMS,
    ConsumerSpec,
    StreamSpec,
    consumer,
    dead_letter_subject,
)
from neuron_dra_common.bus.errors import PermanentError, PublishError
from neuron_dra_common.bus.follow import Follower, ProjectionHandler, replay
from neuron_dra_common.bus.headers import CloudEventAttributes, cloud_event_attributes
from neuron_dra_common.bus.publisher import Publisher, PublishResult
from neuron_dra_common.bus.reconcile import reconcile, reconcile_consumer, reconcile_stream
from neuron_dra_common.bus.rpc import ALLOCATOR_SUBJECT, Responder, RpcError, request
from neuron_dra_common.bus.runner import ConsumerRunner, Delivery, Handler, RunnerOptions

__all__ = [
    "ALLOCATOR_SUBJECT",
    "CONSUMERS",
    "DEAD_LETTER_PREFIX",
    "STREAMS",
    "Bus",
    "CloudEventAttributes",
    "ConsumerRunner",
    "ConsumerSpec",
    "DeadLetterRecord",
    "Delivery",
    "Follower",
    "Handler",
    "PermanentError",
    "ProjectionHandler",
    "PublishError",
    "PublishResult",
    "Publisher",
    "Responder",
    "RpcError",
    "RunnerOptions",
    "StreamSpec",
    "cloud_event_attributes",
    "consumer",
    "dead_letter_subject",
    "read_dead_letter",
    "reconcile",
    "reconcile_consumer",
    "reconcile_stream",
    "replay",
    "request",
]
