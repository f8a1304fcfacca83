"""The dead-letter alert: fires when the stream grows, resolves after a quiet spell, and a
restart neither repeats an old rise nor misses one."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from neuron_dra_alerts.alertmanager import PostableAlert
from neuron_dra_alerts.deadletters import DeadLetterWatch
from neuron_dra_alerts.engine import Alerter
from neuron_dra_common.events import AlertStateChanged


class Sink:
    async def post(self, alerts: Sequence[PostableAlert]) -> None:
        return None


class World:
    def __init__(self) -> None:
        self.records: list[AlertStateChanged] = []
        self.last = 0
        self.now = 0.0

    def alerter(self) -> Alerter:
        async def record(change: AlertStateChanged, msg_id: str) -> None:
            self.records.append(change)

        return Alerter(sink=Sink(), record=record, ttl_seconds=300, clock=lambda: datetime.now(UTC))

    def watch(self, alerter: Alerter) -> DeadLetterWatch:
        async def last() -> int:
            return self.last

        return DeadLetterWatch(
            alerter,
            stream="NEURON_DEADLETTER",
            last_sequence=last,
            quiet_seconds=60,
            monotonic=lambda: self.now,
        )


async def test_fires_on_growth_resolves_when_quiet_and_survives_a_restart() -> None:
    world = World()
    world.last = 4  # dead letters from before the service ever ran: not news
    alerter = world.alerter()
    watch = world.watch(alerter)
    await watch.check()
    assert world.records == []
    world.last = 6
    await watch.check()
    [fired] = world.records
    assert fired.status == "firing"
    assert "2 new message(s)" in fired.annotations["summary"]
    # Restarted while firing; one more arrives while it is down.
    restarted = world.alerter()
    restarted.restore(world.records, [])
    world.last = 7
    again = world.watch(restarted)
    await again.check()
    assert [r.status for r in world.records] == ["firing", "firing"]
    assert "1 new message(s)" in world.records[-1].annotations["summary"]
    world.now += 61
    await again.check()
    assert world.records[-1].status == "resolved"
    await again.check()
    assert len(world.records) == 3
