"""Every event lands in exactly one declared stream, and consumers are found by name."""

from __future__ import annotations

import pytest
from neuron_dra_common.bus import CONSUMERS, STREAMS, consumer, dead_letter_subject
from neuron_dra_common.bus.headers import cloud_event_attributes, event_headers

from chaos.fuzz import subject_matches
from tests.unit.events.samples import samples


@pytest.mark.parametrize("event", samples(), ids=lambda e: e.event_type())
def test_each_event_subject_is_held_by_one_stream(event: object) -> None:
    holders = [s.name for s in STREAMS for p in s.subjects if subject_matches(p, event.subject)]  # type: ignore[attr-defined]
    assert len(holders) == 1, holders


def test_consumers_point_at_declared_streams_and_sources_exist() -> None:
    names = {s.name for s in STREAMS}
    assert all(spec.stream in names for spec in CONSUMERS.values())
    for stream in STREAMS:
        assert set(stream.sources) <= names


def test_unknown_consumer_error_lists_the_known_ones() -> None:
    with pytest.raises(KeyError, match="consumer 'nope' is not declared; known: alert, audit"):
        consumer("nope")


def test_dead_letter_subject_names_stream_and_consumer() -> None:
    spec = consumer("audit")
    assert dead_letter_subject(spec) == "neuron.deadletter.NEURON_AUDIT.audit"


def test_cloudevents_headers_round_trip() -> None:
    event = samples()[2]
    headers = event_headers(event, source="/neuron-dra/health-monitor/ip-1", msg_id="m-1")
    attrs = cloud_event_attributes(headers)
    assert attrs is not None
    assert (attrs.id, attrs.type, attrs.specversion) == (
        "m-1",
        "com.aws.neuron.device.health.v1",
        "1.0",
    )
    assert attrs.subject == "nodes/ip-10-0-0-1.ec2.internal/devices/neurondevice3"
    assert headers["Nats-Msg-Id"] == "m-1"
    assert cloud_event_attributes({"ce-id": "x"}) is None
