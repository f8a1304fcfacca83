"""The shared consumer contract (ack, redelivery, poison to dead letter, idempotency) run
against the audit and alerts services' real handlers."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import msgspec
import pytest
from neuron_dra_alerts.alertmanager import PostableAlert
from neuron_dra_alerts.engine import Alerter
from neuron_dra_audit.auditlog import AuditLog
from neuron_dra_audit.writer import AuditWriter
from neuron_dra_common.bus import Bus, Handler, consumer
from neuron_dra_common.events import AlertStateChanged, DeviceHealthChanged, Event, encode

from tests.contracts.consumer import ConsumerContract


def unhealthy(index: int) -> DeviceHealthChanged:
    return DeviceHealthChanged(
        node="trn2-contract",
        device=f"neurondevice{index}",
        health="Unhealthy",
        severity="uncorrectable",
    )


class TestAuditConsumer(ConsumerContract):
    spec = consumer("audit")

    @pytest.fixture(autouse=True)
    def _file(self, tmp_path: Path) -> Iterator[None]:
        self.path = tmp_path / "audit.jsonl"
        self.logs: list[AuditLog] = []
        yield
        for log in self.logs:
            log.close()

    def sample_event(self, index: int) -> Event:
        return unhealthy(index)

    async def make_handler(self, bus: Bus) -> Handler:
        log = AuditLog(self.path, max_bytes=1 << 20, backups=1, fsync=False, remember=1000)
        log.open()
        self.logs.append(log)
        return AuditWriter(audit_log=log, stdout=None).handle

    async def effect_count(self, event: Event) -> int:
        if not self.path.exists():
            return 0
        want = json.loads(encode(event))
        return sum(json.loads(x)["data"] == want for x in self.path.read_text().splitlines())


class TestAlertsConsumer(ConsumerContract):
    spec = consumer("alert")
    records: list[AlertStateChanged]

    def sample_event(self, index: int) -> Event:
        return unhealthy(index)

    async def make_handler(self, bus: Bus) -> Handler:
        # Recorded in memory: the service's records go to NEURON_ALERTS, which the audit
        # stream sources, so they would come back to this consumer as extra deliveries the
        # contract does not expect (the process tests cover the real recording).
        self.records = []

        async def record(change: AlertStateChanged, msg_id: str) -> None:
            self.records.append(change)

        class Sink:
            async def post(self, alerts: Sequence[PostableAlert]) -> None:
                return None

        return Alerter(sink=Sink(), record=record, ttl_seconds=300).handle

    async def effect_count(self, event: Event) -> int:
        assert isinstance(event, DeviceHealthChanged)
        key = f"NeuronDeviceUnhealthy/{event.node}/{event.device}"
        return sum(r.key == key and r.status == "firing" for r in self.records)


def test_the_contract_events_are_what_the_rules_fire_on() -> None:
    assert msgspec.json.decode(encode(unhealthy(0)))["health"] == "Unhealthy"
