"""The only module of common that talks to NATS: streams, publishing, consumer runners."""

from neuron_dra_common.bus.alive import AliveBeat, AlivePublisher, AliveView, Blind, alive_subject
from neuron_dra_common.bus.cloudevents import CloudEvent, cloud_event_id, encode_line, structured
from neuron_dra_common.bus.connection import Bus
from neuron_dra_common.bus.credentials import BusCredentials, credentials_of
from neuron_dra_common.bus.deadletter import DeadLetterRecord, read_dead_letter
from neuron_dra_common.bus.declarations import (
    CONSUMERS,
    DEAD_LETTER_PREFIX,
    STREAMS,
    ConsumerSpec,
    StreamSpec,
    consumer,
    dead_letter_subject,
    inbox_prefix,
    reader,
)
from neuron_dra_common.bus.errors import PermanentError, PublishError, RetryLater
from neuron_dra_common.bus.follow import Follower, ProjectionHandler, replay
from neuron_dra_common.bus.headers import CloudEventAttributes, cloud_event_attributes
from neuron_dra_common.bus.history import StoredMessage, read_history
from neuron_dra_common.bus.intake import IntakeLimits, Refused, admit, limits_of
from neuron_dra_common.bus.publisher import Publisher, PublishResult
from neuron_dra_common.bus.reconcile import reconcile, reconcile_consumer, reconcile_stream
from neuron_dra_common.bus.rpc import ALLOCATOR_SUBJECT, Responder, RpcError, request
from neuron_dra_common.bus.runner import ConsumerRunner, Delivery, Handler, RunnerOptions

__all__ = [
    "ALLOCATOR_SUBJECT",
    "CONSUMERS",
    "DEAD_LETTER_PREFIX",
    "STREAMS",
    "AliveBeat",
    "AlivePublisher",
    "AliveView",
    "Blind",
    "Bus",
    "BusCredentials",
    "CloudEvent",
    "CloudEventAttributes",
    "ConsumerRunner",
    "ConsumerSpec",
    "DeadLetterRecord",
    "Delivery",
    "Follower",
    "Handler",
    "IntakeLimits",
    "PermanentError",
    "ProjectionHandler",
    "PublishError",
    "PublishResult",
    "Publisher",
    "Refused",
    "Responder",
    "RetryLater",
    "RpcError",
    "RunnerOptions",
    "StoredMessage",
    "StreamSpec",
    "admit",
    "alive_subject",
    "cloud_event_attributes",
    "cloud_event_id",
    "consumer",
    "credentials_of",
    "dead_letter_subject",
    "encode_line",
    "inbox_prefix",
    "limits_of",
    "read_dead_letter",
    "read_history",
    "reader",
    "reconcile",
    "reconcile_consumer",
    "reconcile_stream",
    "replay",
    "request",
    "structured",
]
