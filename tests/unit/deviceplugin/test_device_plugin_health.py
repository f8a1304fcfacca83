"""How the device plugin combines its health sources."""

from __future__ import annotations

from neuron_dra_common.events import DeviceHealthChanged
from neuron_dra_device_plugin.bushealth import BusHealthFeed
from neuron_dra_device_plugin.health import HealthState


def test_a_device_stays_unhealthy_while_any_source_says_so() -> None:
    state = HealthState()
    state.update("presence", frozenset({1}))
    feed = BusHealthFeed(node="n1", devices=range(4), state=state)
    assert feed.apply(DeviceHealthChanged(node="n1", device="neurondevice1", health="Healthy"))
    assert feed.apply(DeviceHealthChanged(node="n1", device="neurondevice3", health="Unhealthy"))
    assert state.unhealthy == {1, 3}
    state.update("presence", frozenset())
    assert state.unhealthy == {3}


def test_unknown_health_is_no_news_and_other_nodes_are_ignored() -> None:
    state = HealthState()
    feed = BusHealthFeed(node="n1", devices=range(4), state=state)
    assert feed.apply(DeviceHealthChanged(node="n1", device="neurondevice0", health="Unknown"))
    assert not feed.apply(
        DeviceHealthChanged(node="n2", device="neurondevice0", health="Unhealthy")
    )
    assert not feed.apply(
        DeviceHealthChanged(node="n1", device="neurondevice9", health="Unhealthy")
    )
    assert state.unhealthy == frozenset()


def test_only_a_change_wakes_the_streams() -> None:
    state = HealthState()
    first = state.next_change()
    assert not state.update("presence", frozenset())
    assert not first.is_set()
    assert state.update("presence", frozenset({2}))
    assert first.is_set()
    assert not state.next_change().is_set()
