"""When discovery publishes: start, change, heartbeat, and the ids that de-duplicate them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
from neuron_dra_common.hardware.model import Counter, EccCounters, NeuronDevice, NodeHardware
from neuron_dra_discovery.inventory import Tracker

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def hw(driver: str = "2.24.7.0", *, ecc_total: int = 0) -> NodeHardware:
    ecc = EccCounters(mem_uncorrected=Counter(total=ecc_total, present=0))
    return NodeHardware(
        instance_type="trn2.48xlarge",
        driver_version=driver,
        devices=tuple(NeuronDevice(index=i, ecc=ecc) for i in range(16)),
    )


def tracker() -> Tracker:
    return Tracker(node="n1", boot_id="boot", heartbeat_seconds=60, dra_driver_version="0.1.0")


def test_first_read_is_published_as_start() -> None:
    d = tracker().observe(hw(), now=T0)
    assert d is not None
    assert d.reason == "start"
    assert d.event.node == "n1"
    assert d.event.boot_id == "boot"
    assert d.event.dra_driver_version == "0.1.0"
    assert d.msg_id.startswith("inventory/n1/")


def test_same_hardware_is_not_published_again_before_the_heartbeat() -> None:
    t = tracker()
    t.observe(hw(), now=T0)
    assert t.observe(hw(), now=T0 + timedelta(seconds=10)) is None
    beat = t.observe(hw(), now=T0 + timedelta(seconds=61))
    assert beat is not None
    assert beat.reason == "heartbeat"


def test_heartbeat_keeps_generation_and_gets_a_new_id_each_period() -> None:
    t = tracker()
    first = t.observe(hw(), now=T0)
    beat = t.observe(hw(), now=T0 + timedelta(seconds=61))
    assert first is not None
    assert beat is not None
    assert beat.event.generation == first.event.generation
    assert beat.msg_id != first.msg_id


def test_a_change_is_published_at_once_with_a_higher_generation() -> None:
    t = tracker()
    first = t.observe(hw(), now=T0)
    changed = t.observe(hw("2.26.0.0"), now=T0 + timedelta(seconds=1))
    assert first is not None
    assert changed is not None
    assert changed.reason == "change"
    assert changed.event.generation > first.event.generation


def test_counters_moving_is_not_a_change_but_they_ride_along() -> None:
    t = tracker()
    t.observe(hw(ecc_total=0), now=T0)
    assert t.observe(hw(ecc_total=5), now=T0 + timedelta(seconds=10)) is None
    beat = t.observe(hw(ecc_total=7), now=T0 + timedelta(seconds=70))
    assert beat is not None
    ecc = beat.event.hardware.devices[0].ecc.mem_uncorrected
    assert ecc is not None
    assert ecc.total == 7


def test_a_restart_with_the_same_content_in_the_same_period_reuses_the_id() -> None:
    """JetStream then drops the second publish: identical inventories stored once."""
    a = tracker().observe(hw(), now=T0)
    b = tracker().observe(hw(), now=T0 + timedelta(seconds=5))
    assert a is not None
    assert b is not None
    assert a.msg_id == b.msg_id


def test_changing_back_to_an_earlier_content_is_not_swallowed() -> None:
    t = tracker()
    a = t.observe(hw(), now=T0)
    t.observe(hw("2.26.0.0"), now=T0 + timedelta(seconds=1))
    back = t.observe(hw(), now=T0 + timedelta(seconds=2))
    assert a is not None
    assert back is not None
    assert back.reason == "change"
    assert back.msg_id != a.msg_id


def test_a_failed_publish_is_retried_on_the_next_read() -> None:
    t = tracker()
    t.observe(hw(), now=T0)
    t.forget_sent()
    again = t.observe(hw(), now=T0 + timedelta(seconds=10))
    assert again is not None


def test_the_inventory_round_trips_through_the_event_codec() -> None:
    from neuron_dra_common.events import decode, encode

    d = tracker().observe(hw(), now=T0)
    assert d is not None
    assert decode(encode(d.event)) == d.event
    assert msgspec.json.decode(encode(d.event))["type"] == "node.inventory.v1"
