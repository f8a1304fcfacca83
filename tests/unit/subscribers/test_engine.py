"""The alerts engine with a recording sink: changes recorded before sending, re-sends, and
events delivered again after a restart."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest
from neuron_dra_alerts.alertmanager import AlertmanagerError, PostableAlert
from neuron_dra_alerts.engine import Alerter
from neuron_dra_common.bus import Delivery
from neuron_dra_common.events import (
    AlertStateChanged,
    AllocationDecided,
    AnyEvent,
    DeviceHealth,
    DeviceHealthChanged,
    ObjectRef,
)

NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)


class Sink:
    def __init__(self) -> None:
        self.posts: list[list[PostableAlert]] = []
        self.down = False

    async def post(self, alerts: Sequence[PostableAlert]) -> None:
        if self.down:
            raise AlertmanagerError("connection refused")
        self.posts.append(list(alerts))


class Store:
    def __init__(self) -> None:
        self.records: list[AlertStateChanged] = []

    async def record(self, change: AlertStateChanged, msg_id: str) -> None:
        self.records.append(change)


def alerter(sink: Sink, store: Store) -> Alerter:
    return Alerter(sink=sink, record=store.record, ttl_seconds=300, clock=lambda: NOW)


def delivery(seq: int) -> Delivery:
    return Delivery(
        subject="s",
        stream="NEURON_AUDIT",
        consumer="alert",
        stream_sequence=seq,
        consumer_sequence=seq,
        deliveries=1,
        msg_id=f"m{seq}",
    )


def health(state: DeviceHealth, dev: str = "d0") -> DeviceHealthChanged:
    return DeviceHealthChanged(
        node="n1",
        device=dev,
        health=state,
        severity="uncorrectable" if state == "Unhealthy" else "",
    )


async def feed(a: Alerter, *events: tuple[int, AnyEvent]) -> None:
    for seq, event in events:
        await a.handle(event, delivery(seq))


async def test_fire_then_resolve_records_and_sends_each_once() -> None:
    sink, store = Sink(), Store()
    a = alerter(sink, store)
    await feed(a, (1, health("Unhealthy")), (2, health("Unhealthy")), (3, health("Healthy")))
    assert [r.status for r in store.records] == ["firing", "resolved"]
    [[fired], [resolved]] = sink.posts
    assert fired.ends_at == NOW + timedelta(seconds=300)
    assert resolved.ends_at == NOW
    assert resolved.labels == fired.labels


async def test_an_older_event_delivered_again_never_fires_a_resolved_alert() -> None:
    sink, store = Sink(), Store()
    a = alerter(sink, store)
    await feed(a, (1, health("Unhealthy")), (2, health("Healthy")))
    restarted = alerter(sink, Store())
    restarted.restore(store.records, [])
    await feed(restarted, (1, health("Unhealthy")))  # its ack had been lost
    assert restarted.firing() == []
    assert sink.posts[-1][0].ends_at == NOW  # nothing new sent as firing


async def test_the_event_that_made_the_state_is_sent_again_when_delivered_again() -> None:
    sink, store = Sink(), Store()
    a = alerter(sink, store)
    await feed(a, (5, health("Unhealthy")))
    await feed(a, (5, health("Unhealthy")))
    assert len(store.records) == 1
    assert len(sink.posts) == 2


async def test_alertmanager_down_holds_nothing_up_and_the_resend_delivers() -> None:
    sink, store = Sink(), Store()
    a = alerter(sink, store)
    sink.down = True
    await feed(a, (1, health("Unhealthy", "d0")), (2, health("Unhealthy", "d1")))
    await feed(a, (3, health("Healthy", "d0")))
    assert sink.posts == []
    assert len(store.records) == 3
    sink.down = False
    assert await a.resend()
    [sent] = sink.posts
    by_device = {p.labels["device"]: p.ends_at for p in sent}
    assert by_device == {"d0": NOW, "d1": NOW + timedelta(seconds=300)}
    assert a.unsent == set()
    sink.posts.clear()
    await a.resend()  # later re-sends carry only what fires
    assert [p.labels["device"] for p in sink.posts[0]] == ["d1"]


async def test_restore_sends_what_was_firing_and_labels_name_the_holder() -> None:
    sink, store = Sink(), Store()
    a = alerter(sink, store)
    ref = ObjectRef(namespace="ml", name="train", uid="u")
    await feed(
        a,
        (1, AllocationDecided(request_id="r", workload=ref, granted=True, nodes=("n1",))),
        (2, health("Unhealthy")),
    )
    assert store.records[0].labels["workload"] == "train"
    restarted = alerter(Sink(), Store())
    restarted.restore(store.records, [])
    assert [s.key for s in restarted.firing()] == ["NeuronDeviceUnhealthy/n1/d0"]
    assert restarted.unsent == {"NeuronDeviceUnhealthy/n1/d0"}


@pytest.mark.parametrize("ttl", [30.0, 60.0])
def test_ttl_must_exceed_the_resend_interval(ttl: float) -> None:
    from neuron_dra_alerts.settings import AlertsSettings
    from neuron_dra_common.settings import SettingsError, load

    with pytest.raises(SettingsError, match="ALERT_TTL_SECONDS"):
        load(AlertsSettings, environ={"NEURON_DRA_ALERT_TTL_SECONDS": str(ttl)})
