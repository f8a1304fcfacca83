"""The claim source, claim events, failure Events, health from events, crash points."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
from neuron_dra_common.events import ClaimPrepared, ClaimUnprepared, DeviceHealthChanged
from neuron_dra_common.events.base import Event
from neuron_dra_common.kube import ApiException
from neuron_dra_kubelet_plugin import faults
from neuron_dra_kubelet_plugin.bushealth import BusHealth
from neuron_dra_kubelet_plugin.checkpoint import ClaimEntry, ClaimState, PreparedDevice
from neuron_dra_kubelet_plugin.claims import ClaimRef, claim_from_api
from neuron_dra_kubelet_plugin.claimsource import ApiClaimSource
from neuron_dra_kubelet_plugin.health import Health
from neuron_dra_kubelet_plugin.kubeevents import ClaimEventRecorder
from neuron_dra_kubelet_plugin.observe import ClaimEvents
from neuron_dra_kubelet_plugin.plan import PrepareError

from tests.unit.kubelet_plugin.support import claim_json

REF = ClaimRef(namespace="default", name="claim-u1", uid="u1")


class Reader:
    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.calls = 0

    async def get(self, resource: Any, name: str, *, namespace: str | None = None) -> Any:
        self.calls += 1
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


async def test_each_claim_is_read_from_the_api_when_the_kubelet_names_it() -> None:
    reader = Reader(claim_json("u1", [0]))
    source = ApiClaimSource(reader)
    for _ in range(2):  # a retry reads the claim again: always current
        claim = await source.get(REF)
        assert claim is not None
        assert claim.metadata.uid == "u1"
        assert claim.status.allocation is not None
    assert reader.calls == 2
    assert source.stats.api_reads == 2


async def test_a_missing_claim_is_none_and_an_api_failure_names_the_claim() -> None:
    assert await ApiClaimSource(Reader(ApiException(status=404))).get(REF) is None
    with pytest.raises(PrepareError, match="ResourceClaim default/claim-u1: reading it"):
        await ApiClaimSource(Reader(ApiException(status=503, reason="busy"))).get(REF)


def entry(uid: str = "u1") -> ClaimEntry:
    return ClaimEntry(
        uid=uid,
        namespace="default",
        name=f"claim-{uid}",
        state=ClaimState.PREPARE_COMPLETED,
        boot_id="b",
        devices=(
            PreparedDevice(
                request_names=("neurons",),
                pool="n1",
                device="neurondevice3",
                cdi_device_ids=("neuron.aws.com/neuron=u1-neurondevice3",),
            ),
        ),
    )


class Sink:
    def __init__(self) -> None:
        self.events: list[tuple[Event, str | None]] = []

    async def publish_many(
        self, events: Sequence[Event], *, msg_ids: Sequence[str] | None = None
    ) -> object:
        assert msg_ids is not None
        assert len(msg_ids) == len(events)
        self.events += zip(events, msg_ids, strict=True)
        return None


async def test_claim_events_wait_for_the_bus_and_carry_stable_ids() -> None:
    events = ClaimEvents(node="n1", boot_id="b")
    events.prepared(entry())
    events.unprepared(entry())
    task = asyncio.create_task(events.run())
    await asyncio.sleep(0.01)
    assert events.pending == 2  # no bus yet: nothing lost, nothing sent
    sink = Sink()
    events.attach(sink)
    events.stop()
    await asyncio.wait_for(task, 5)
    (prepared, pid), (unprepared, uid) = sink.events
    assert isinstance(prepared, ClaimPrepared)
    assert prepared.devices == ("neurondevice3",)
    assert prepared.cdi_devices == ("neuron.aws.com/neuron=u1-neurondevice3",)
    assert isinstance(unprepared, ClaimUnprepared)
    assert pid == "claim-prepared/n1/u1/b"
    assert uid == "claim-unprepared/n1/u1/b"


class Writer:
    def __init__(self) -> None:
        self.posted: list[dict[str, Any]] = []

    async def post_event(
        self,
        involved: Mapping[str, str],
        *,
        reason: str,
        message: str,
        component: str,
        warning: bool = False,
        host: str = "",
    ) -> Any:
        self.posted.append(
            {
                "involvedObject": dict(involved),
                "reason": reason,
                "message": message,
                "type": "Warning" if warning else "Normal",
                "host": host,
            }
        )
        return {}


async def test_a_failed_claim_gets_one_warning_event_per_pod() -> None:
    obj = claim_json("u1", [0])
    obj["status"]["reservedFor"] = [{"resource": "pods", "name": "pod0", "uid": "p1"}]
    claim = claim_from_api(obj)
    writer = Writer()
    recorder = ClaimEventRecorder(writer, node="n1")
    task = asyncio.create_task(recorder.run())
    for _ in range(3):  # the kubelet retries; the user reads the reason once
        recorder.failed(
            claim, "config[0].opaque.parameters.logicalNeuronCore: 3 is not one of 1, 2"
        )
    recorder.stop()
    await asyncio.wait_for(task, 5)
    assert len(writer.posted) == 1
    event = writer.posted[0]
    assert event["host"] == "n1"
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "pod0",
        "uid": "p1",
        "namespace": "default",
    }
    assert (event["type"], event["reason"]) == ("Warning", "FailedPrepare")
    assert "logicalNeuronCore" in event["message"]


def test_health_events_of_this_node_change_the_stream() -> None:
    health = BusHealth(node="n1", pool="n1", devices=["neurondevice0", "neurondevice1"])
    assert {r.health for r in health.snapshot()} == {Health.HEALTHY}
    at = datetime(2026, 1, 1, tzinfo=UTC)
    bad = DeviceHealthChanged(
        node="n1",
        device="neurondevice1",
        health="Unhealthy",
        reason="HBM uncorrectable",
        error_code="1201",
        observed_at=at,
    )
    assert health.apply(bad)
    assert not health.apply(
        DeviceHealthChanged(node="n2", device="neurondevice1", health="Unhealthy")
    )
    reports = {r.device: r for r in health.snapshot()}
    assert reports["neurondevice1"].health is Health.UNHEALTHY
    assert reports["neurondevice1"].message == "1201: HBM uncorrectable"
    assert reports["neurondevice1"].updated_at == int(at.timestamp())
    assert reports["neurondevice0"].health is Health.HEALTHY


def test_crash_points_only_when_asked() -> None:
    assert faults.from_env({}) is faults.no_crash
    with pytest.raises(ValueError, match="NEURON_DRA_PLUGIN_CRASH_AT='nowhere'"):
        faults.from_env({faults.CRASH_ENV: "nowhere"})
    crash = faults.from_env({faults.CRASH_ENV: "prepare:spec-written"})
    crash("prepare:started-saved")  # another step: nothing happens


def test_the_plugin_expects_the_whole_node_device_on_ultraserver_nodes_only() -> None:
    from neuron_dra_common.topology import instance_spec
    from neuron_dra_kubelet_plugin.settings import node_device_for

    assert node_device_for(instance_spec("trn2u.48xlarge")) == "neuronnode"
    assert node_device_for(instance_spec("trn2.48xlarge")) is None
