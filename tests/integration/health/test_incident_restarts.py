"""Kill -9 the failure detector and the alerts service together, mid-incident, while the
fleet keeps changing: a real NATS, a real Alertmanager, both services as processes.

A node lost before the kill comes back while both are down, and another node goes silent
then. After the restart each change is declared once (no second NodeLost for the node
already lost, none missed for the two changes made in the dark) and Alertmanager shows the
outcome: the first node's alert resolved, the second's firing, each alert fired once.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from neuron_dra_cli.stack import alerting
from neuron_dra_common.bus import Bus, replay
from neuron_dra_common.bus.declarations import AUDIT
from neuron_dra_common.events import AlertStateChanged, NodeLost, NodeRecovered

from tests.fixtures.nats import NatsServer
from tests.fixtures.subscribers import Alertmanager, ServiceProcess
from tests.integration.health.test_failure_detector import (
    Nodes,
    beating,  # noqa: F401  (the fixture, used by name)
    node_events,
    start_detector,
    started,
)

ALERT = "NeuronNodeLost"


@pytest.fixture
def alerts(
    nats_server: NatsServer, alertmanager: Alertmanager, tmp_path: Path
) -> Iterator[ServiceProcess]:
    [_, component] = alerting.subscriber_components(
        nats_url=nats_server.url, state_dir=tmp_path, alertmanager_url=alertmanager.url
    )
    component.env.update(nats_server.open_env)
    service = ServiceProcess(component, log=tmp_path / "alerts.log")
    try:
        yield service
    finally:
        service.stop()


async def eventually(probe: Callable[[], Any], *, what: str, within: float = 30) -> Any:
    deadline = time.monotonic() + within
    while not (found := await asyncio.to_thread(probe)):
        assert time.monotonic() < deadline, f"timed out after {within} s waiting for {what}"
        await asyncio.sleep(0.3)
    return found


async def verdicts(bus: Bus) -> list[tuple[str, str]]:
    return [(type(e).__name__, str(getattr(e, "node", ""))) for e in await node_events(bus)]


async def alert_changes(bus: Bus, node: str) -> list[str]:
    events = await replay(bus, name="test-reader", stream=AUDIT.name, subject="neuron.alert.>")
    return [
        e.status for e in events if isinstance(e, AlertStateChanged) and e.key == f"{ALERT}/{node}"
    ]


async def test_killing_detector_and_alerts_mid_incident_repeats_nothing_and_misses_nothing(
    nats_server: NatsServer,
    nats_bus: Bus,
    beating: Nodes,  # noqa: F811
    alerts: ServiceProcess,
    alertmanager: Alertmanager,
    tmp_path: Path,
) -> None:
    log = tmp_path / "detector.log"
    detector = start_detector(nats_server, log)
    try:
        alerts.start()
        await started(log)
        beating.up.discard("node-4")
        await eventually(
            lambda: alertmanager.active(alertname=ALERT, node="node-4"),
            what="node-4's alert in Alertmanager",
        )
        assert await verdicts(nats_bus) == [("NodeLost", "node-4")]

        # Both die at once; in the dark node-4 comes back and node-3 goes silent.
        detector.send_signal(signal.SIGKILL)
        detector.wait(timeout=10)
        alerts.kill9()
        beating.up.add("node-4")
        beating.up.discard("node-3")
        await asyncio.sleep(3)
        detector = start_detector(nats_server, log)
        alerts.start()
        await started(log, count=2)

        await eventually(
            lambda: alertmanager.active(alertname=ALERT, node="node-3"),
            what="node-3's alert in Alertmanager",
        )
        await eventually(
            lambda: not alertmanager.active(alertname=ALERT, node="node-4"),
            what="node-4's alert resolved",
        )
        await asyncio.sleep(5)  # long enough for a repeat to show
        seen = await verdicts(nats_bus)
        assert seen[0] == ("NodeLost", "node-4")
        assert sorted(seen[1:]) == [("NodeLost", "node-3"), ("NodeRecovered", "node-4")], seen
        assert await alert_changes(nats_bus, "node-4") == ["firing", "resolved"]
        assert await alert_changes(nats_bus, "node-3") == ["firing"]
        assert [a["labels"]["node"] for a in alertmanager.active(alertname=ALERT)] == ["node-3"]
        assert {type(e) for e in await node_events(nats_bus)} <= {NodeLost, NodeRecovered}
    finally:
        detector.send_signal(signal.SIGTERM)
        code = detector.wait(timeout=30)
    assert code == 0, log.read_text()[-3000:]
