"""The audit service as a process against a real NATS: CloudEvents lines in the file and on
stdout, nothing lost or written twice across a kill -9, undecodable messages dead-lettered,
and ``neuron-dra events`` showing what a person asked for."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from neuron_dra_cli.stack import alerting
from neuron_dra_common.bus import Bus
from neuron_dra_common.events import ClaimPrepared, DeviceHealthChanged, ObjectRef

from tests.contracts.support import dead_letters
from tests.fixtures.nats import NatsServer
from tests.fixtures.subscribers import ServiceProcess

REQUIRED = ("specversion", "id", "source", "type", "subject", "time", "datacontenttype", "data")


@pytest.fixture
def audit(nats_server: NatsServer, tmp_path: Path) -> Iterator[ServiceProcess]:
    [component, _] = alerting.subscriber_components(
        nats_url=nats_server.url, state_dir=tmp_path, alertmanager_url="http://127.0.0.1:1"
    )
    component.env.update(nats_server.open_env)
    component.env["NEURON_DRA_STDOUT"] = "true"
    service = ServiceProcess(component, log=tmp_path / "audit.log", stdout=tmp_path / "stdout")
    try:
        yield service
    finally:
        service.stop()


def lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


async def wait_lines(path: Path, count: int, within: float = 20) -> list[dict[str, Any]]:
    deadline = time.monotonic() + within
    while len(found := lines(path)) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"{path}: {len(found)} lines after {within}s, wanted {count}")
        await asyncio.sleep(0.05)
    return found


def unhealthy(node: str, device: str) -> DeviceHealthChanged:
    return DeviceHealthChanged(
        node=node,
        device=device,
        health="Unhealthy",
        previous="Healthy",
        error_type="SRAM_UNCORRECTABLE_ERROR",
        severity="uncorrectable",
        action="replace-instance",
        observed_at=datetime(2026, 3, 1, 12, tzinfo=UTC),
    )


async def test_each_event_is_one_valid_cloudevents_line_in_file_and_stdout(
    nats_bus: Bus, audit: ServiceProcess, tmp_path: Path
) -> None:
    audit.start()
    publisher = nats_bus.publisher(source="/test/health-monitor")
    sent = [
        unhealthy("trn2-a", "neurondevice3"),
        ClaimPrepared(
            node="trn2-a",
            claim=ObjectRef(namespace="ml", name="train-0"),
            devices=("neurondevice0",),
        ),
    ]
    results = [await publisher.publish(e) for e in sent]
    written = await wait_lines(alerting.audit_file(tmp_path), 2)
    for line, event, result in zip(written, sent, results, strict=True):
        assert set(REQUIRED) <= set(line)
        assert line["specversion"] == "1.0"
        assert line["datacontenttype"] == "application/json"
        assert line["source"] == "/test/health-monitor"
        assert line["type"] == f"com.aws.neuron.{event.event_type()}"
        assert line["subject"] == event.ce_subject
        assert line["id"] == result.msg_id
        assert line["data"]["type"] == event.event_type()
        datetime.fromisoformat(line["time"])
    assert written[0]["data"]["error_type"] == "SRAM_UNCORRECTABLE_ERROR"
    assert await wait_lines(tmp_path / "stdout", 2) == written


async def test_kill9_after_write_before_ack_writes_nothing_twice_and_loses_nothing(
    nats_bus: Bus, audit: ServiceProcess, tmp_path: Path
) -> None:
    file = alerting.audit_file(tmp_path)
    publisher = nats_bus.publisher(source="/test")
    first = [await publisher.publish(unhealthy("trn2-a", f"neurondevice{i}")) for i in range(3)]
    # Dies (SIGKILL) right after writing the first line, before acknowledging it.
    audit.start(env={"NEURON_DRA_AUDIT_CRASH_AT": "after-write"}, wait_ready=False)
    assert audit.wait_exit() == -9
    assert len(lines(file)) == 1
    # More events while it is down, then a normal start.
    later = [await publisher.publish(unhealthy("trn2-b", f"neurondevice{i}")) for i in range(2)]
    audit.start()
    # What the killed process had fetched comes back once the consumer's ack wait (30 s)
    # has passed.
    await wait_lines(file, 5, within=90)
    await asyncio.sleep(1.0)  # give a duplicate the time to show up
    ids = [line["id"] for line in lines(file)]
    assert sorted(ids) == sorted(r.msg_id for r in first + later)
    assert len(ids) == len(set(ids)) == 5


async def test_an_undecodable_message_goes_to_the_dead_letter_with_its_reason(
    nats_bus: Bus, audit: ServiceProcess, tmp_path: Path
) -> None:
    audit.start()
    await nats_bus.js.publish(
        "neuron.health.trn2-a.neurondevice1",
        b'{"type":"device.health.v9"}',
        headers={"Nats-Msg-Id": "bad-1"},
    )
    good = await nats_bus.publisher(source="/test").publish(unhealthy("trn2-a", "neurondevice2"))
    records = await dead_letters(nats_bus)
    [record] = [r for r in records if r.consumer == "audit"]
    assert record.kind == "decode"
    assert "device.health.v9" in record.reason
    assert record.payload == b'{"type":"device.health.v9"}'
    [line] = await wait_lines(alerting.audit_file(tmp_path), 1)
    assert line["id"] == good.msg_id


async def test_neuron_dra_events_shows_one_nodes_events_as_cloudevents(
    nats_bus: Bus, nats_server: NatsServer
) -> None:
    publisher = nats_bus.publisher(source="/test")
    mine = await publisher.publish(unhealthy("trn2-x", "neurondevice5"))
    await publisher.publish(unhealthy("trn2-y", "neurondevice5"))
    claim = await publisher.publish(
        ClaimPrepared(
            node="trn2-x", claim=ObjectRef(namespace="ml", name="c"), devices=("neurondevice1",)
        )
    )
    # The audit stream sources the others: wait until it holds all three.
    deadline = time.monotonic() + 10
    while (await nats_bus.js.stream_info("NEURON_AUDIT")).state.messages < 3:
        assert time.monotonic() < deadline, "audit stream did not fill"
        await asyncio.sleep(0.05)
    cli = [sys.executable, "-m", "neuron_dra_cli", "events", "--nats-servers", nats_server.url]
    done = await asyncio.to_thread(
        subprocess.run,
        [*cli, "--node", "trn2-x", "--since", "1h", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    out = done.stdout
    got = [json.loads(line) for line in out.splitlines()]
    # In the audit stream's order, which interleaves its sources (health, claims) as they
    # arrive, not necessarily as published.
    assert sorted(g["id"] for g in got) == sorted([mine.msg_id, claim.msg_id])
    assert all(set(REQUIRED) <= set(g) for g in got)
    assert {g["data"]["node"] for g in got} == {"trn2-x"}
    text = (
        await asyncio.to_thread(
            subprocess.run,
            [*cli, "--claim", "ml/c"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
    ).stdout.splitlines()
    assert len(text) == 1
    assert "resourceclaims/ml/c" in text[0]
    assert "prepared on trn2-x: neurondevice1" in text[0]
