"""Least privilege on the bus, attacked: real nats-server running the component's auth.conf,
the real callout, the real apiserver's tokens. Each attack uses the credentials the identity
really has, is refused visibly (the server's permissions violation, a JetStream error, the
callout's log), leaves the streams as they were, and the legitimate action beside it works.
Rows in tests/attacks/rows_bus.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import nats.errors
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import api
from nats.js.errors import APIError
from neuron_dra_bus_auth.identities import service_account_of
from neuron_dra_bus_auth.permissions import (
    ALLOCATOR_QUEUE,
    ALLOCATOR_SUBJECT,
    CLUSTER_SERVICES,
    NODE_AGENTS,
    Role,
)
from neuron_dra_common.bus import Bus, BusCredentials, RpcError, inbox_prefix, request
from neuron_dra_common.bus.declarations import (
    HEALTH,
    HEARTBEAT,
    INVENTORY,
    STREAMS,
    consumer,
    published_subject,
)
from neuron_dra_common.events import (
    AllocationReleased,
    DeviceHealthChanged,
    NodeInventory,
    NodeLost,
    ObjectRef,
    encode,
    subject_token,
)
from neuron_dra_common.hardware.model import NodeHardware

from tests.contracts.support import heartbeat
from tests.fixtures.natsclients import client, refused, reported, violated
from tests.integration.busauth.conftest import AuthenticatedBus, neuron_limits

pytestmark = pytest.mark.stack

RELEASE = AllocationReleased(
    request_id="release-1", workload=ObjectRef(namespace="team-a", name="train", uid="u1")
)


def _nodes(bus: AuthenticatedBus) -> list[str]:
    items = bus.stack.get_json("nodes")["items"]
    return sorted(item["metadata"]["name"] for item in items)


def _agent_token(bus: AuthenticatedBus, role: Role, node: str) -> Path:
    account = service_account_of(role)
    return bus.token_file(account, pod=bus.pod_on(node, service_account=account))


@contextlib.asynccontextmanager
async def _as(
    bus: AuthenticatedBus, token: Path, role: Role, *, node: str = ""
) -> AsyncIterator[Bus]:
    """Connected as ``role`` (of ``node``) with its token and its own reply inbox, as the
    services connect."""
    connected = await Bus.connect(
        [bus.url],
        name=role,
        credentials=BusCredentials(token_file=str(token)),
        inbox=inbox_prefix(role, node=node),
    )
    try:
        yield connected
    finally:
        await connected.close()


@contextlib.asynccontextmanager
async def _raw(
    bus: AuthenticatedBus, token: Path, role: Role, *, node: str = ""
) -> AsyncIterator[tuple[Client, list[str]]]:
    """A bare client of ``role`` and the errors the server reports to it."""
    errors: list[str] = []
    text = await asyncio.to_thread(token.read_text)
    nc = await client(bus.url, token=text, errors=errors, inbox=inbox_prefix(role, node=node))
    try:
        yield nc, errors
    finally:
        await nc.close()


async def _declared(bus: AuthenticatedBus) -> Path:
    admin = bus.token_file(service_account_of("admin"))
    async with _as(bus, admin, "admin") as connected:
        await connected.reconcile()
    return admin


async def _messages(bus: AuthenticatedBus, admin: Path) -> dict[str, int]:
    """Every stream's message count, read by the admin."""
    async with _as(bus, admin, "admin") as connected:
        return {s.name: (await connected.js.stream_info(s.name)).state.messages for s in STREAMS}


def _hardware() -> NodeHardware:
    return NodeHardware(instance_type="trn2.48xlarge", driver_version="2.24.7.0", devices=())


def _device_health(node: str) -> DeviceHealthChanged:
    return DeviceHealthChanged(node=node, device="neurondevice0", health="Unhealthy")


async def test_anonymous_connect_is_refused(authenticated_bus: AuthenticatedBus) -> None:
    bus = authenticated_bus
    assert "authorization violation" in await refused(bus.url, token=None)
    bus.callout_says("no token: connect with the pod's projected ServiceAccount token")
    # Beside it, a client with its identity's token is admitted.
    reader = bus.token_file(service_account_of("reader"))
    async with _as(bus, reader, "reader") as connected:
        assert connected.connected
    assert "reader" in bus.callout_says("auth callout: admitted")


async def test_a_token_made_for_another_audience_is_refused(
    authenticated_bus: AuthenticatedBus,
) -> None:
    """A token the apiserver itself accepts (its default audience), or one for another
    service, is worth nothing on the bus; the same ServiceAccount's bus token is admitted."""
    bus = authenticated_bus
    account = service_account_of("topology-allocator")
    for audience in ("https://kubernetes.default.svc.cluster.local", "vault"):
        token = bus.token_file(account, audience=audience).read_text()
        assert "authorization violation" in await refused(bus.url, token=token)
    line = bus.callout_says("token not authenticated")
    assert "audience" in line.lower(), line
    async with _as(bus, bus.token_file(account), "topology-allocator") as connected:
        assert connected.connected


async def test_discovery_of_node_a_cannot_publish_node_bs_inventory_or_heartbeat(
    authenticated_bus: AuthenticatedBus,
) -> None:
    bus = authenticated_bus
    admin = await _declared(bus)
    a, b = _nodes(bus)[:2]
    token = _agent_token(bus, "discovery", a)
    caplog_errors: list[str] = []
    async with _raw(bus, token, "discovery", node=a) as (nc, errors):
        js = nc.jetstream(timeout=2)
        for event in (heartbeat(b), _inventory(b)):
            with pytest.raises(nats.errors.TimeoutError):
                await js.publish(event.subject, encode(event))
            assert await reported(errors, f'publish to "{event.subject}"'), errors
        # Its own node's, beside it: stored.
        for event in (heartbeat(a), _inventory(a)):
            ack = await js.publish(event.subject, encode(event))
            assert ack.stream in (HEARTBEAT.name, INVENTORY.name)
        caplog_errors = errors
    assert not violated(caplog_errors, f'publish to "neuron.heartbeat.{subject_token(a)}"')
    async with _as(bus, admin, "admin") as reader:
        for stream in (HEARTBEAT.name, INVENTORY.name):
            info = await reader.js.stream_info(stream, subjects_filter=">")
            assert {published_subject(x) for x in info.state.subjects or {}} == {
                f"neuron.{'heartbeat' if stream == HEARTBEAT.name else 'inventory'}."
                f"{subject_token(a)}"
            }


def _inventory(node: str) -> NodeInventory:
    return NodeInventory(node=node, boot_id="boot-1", generation=1, hardware=_hardware())


async def test_the_health_probe_cannot_declare_its_node_lost_or_report_another_nodes_devices(
    authenticated_bus: AuthenticatedBus,
) -> None:
    bus = authenticated_bus
    admin = await _declared(bus)
    a, b = _nodes(bus)[:2]
    lost = NodeLost(node=a, detected_at=datetime.now(UTC), reason="forged by the probe")
    async with _raw(bus, _agent_token(bus, "health-probe", a), "health-probe", node=a) as (
        nc,
        errors,
    ):
        js = nc.jetstream(timeout=2)
        for event in (lost, _device_health(b)):
            with pytest.raises(nats.errors.TimeoutError):
                await js.publish(event.subject, encode(event))
            assert await reported(errors, f'publish to "{event.subject}"'), errors
        assert (await _messages(bus, admin))[HEALTH.name] == 0
        # Its own node's device health, beside it: stored.
        ack = await js.publish(_device_health(a).subject, encode(_device_health(a)))
        assert ack.stream == HEALTH.name
    # Only the failure detector declares a node lost.
    detector = bus.token_file(service_account_of("failure-detector"))
    async with _as(bus, detector, "failure-detector") as connected:
        ack = await connected.js.publish(lost.subject, encode(lost), timeout=5)
        assert ack.stream == HEALTH.name
    async with _as(bus, admin, "admin") as reader:
        info = await reader.js.stream_info(HEALTH.name, subjects_filter=">")
        assert info.state.subjects == {
            f"neuron.health.{subject_token(a)}.neurondevice0": 1,
            f"neuron.health.{subject_token(a)}.node": 1,
        }


async def test_a_node_agent_cannot_read_another_identitys_replies(
    authenticated_bus: AuthenticatedBus, caplog: pytest.LogCaptureFixture
) -> None:
    """The allocator's answers and every JetStream ack come back on inboxes: a node agent
    may not subscribe to all of them, nor to another identity's, nor another node's."""
    bus = authenticated_bus
    admin = await _declared(bus)
    a, b = _nodes(bus)[:2]
    token = _agent_token(bus, "kubelet-plugin", a)
    stolen: list[Msg] = []

    async def steal(msg: Msg) -> None:
        stolen.append(msg)

    others = (
        "_INBOX.>",
        f"{inbox_prefix('topology-allocator')}.>",
        f"{inbox_prefix('ultraserver-operator')}.>",
        f"{inbox_prefix('kubelet-plugin', node=b)}.>",
    )
    async with _raw(bus, token, "kubelet-plugin", node=a) as (nc, errors):
        for subject in others:
            await nc.subscribe(subject, cb=steal)
            await nc.flush()
            assert await reported(errors, f'subscription to "{subject}"'), errors
        # Others' replies flow meanwhile, and none reaches it.
        async with _as(bus, admin, "admin") as connected:
            await connected.js.publish(heartbeat(a).subject, encode(heartbeat(a)), timeout=5)
        await asyncio.sleep(0.5)
        assert stolen == []
        # Its own inbox, beside it: its JetStream acks come back.
        ack = await nc.jetstream(timeout=5).publish(
            f"neuron.claim.prepared.{subject_token(a)}.default.claim", b"{}"
        )
        assert ack.stream == "NEURON_CLAIMS"

    # A client connecting with another prefix than its identity's is told why at once.
    caplog.set_level(logging.ERROR, logger="neuron_dra_common.bus.connection")
    connected = await Bus.connect(
        [bus.url], name="kubelet-plugin", credentials=BusCredentials(token_file=str(token))
    )
    try:
        with pytest.raises(nats.errors.TimeoutError):
            await connected.js.publish(
                f"neuron.claim.prepared.{subject_token(a)}.default.other", b"{}", timeout=1
            )
    finally:
        await connected.close()
    said = [r for r in caplog.records if "refused this client's reply inbox" in r.getMessage()]
    assert said, caplog.text
    assert "_inbox" in str(getattr(said[0], "error", "")).lower(), caplog.text


NOT_OPERATORS: tuple[Role, ...] = (
    *NODE_AGENTS,
    *(r for r in CLUSTER_SERVICES if r != "ultraserver-operator"),
    "reader",
)


async def test_only_the_operator_asks_the_allocator_to_release(
    authenticated_bus: AuthenticatedBus,
) -> None:
    bus = authenticated_bus
    await _declared(bus)
    node = _nodes(bus)[0]
    received: list[bytes] = []

    async def answer(msg: Msg) -> None:
        received.append(msg.data)
        await msg.respond(encode(RELEASE))

    allocator = bus.token_file(service_account_of("topology-allocator"))
    async with _raw(bus, allocator, "topology-allocator") as (nc, allocator_errors):
        await nc.subscribe(ALLOCATOR_SUBJECT, queue=ALLOCATOR_QUEUE, cb=answer)
        await nc.flush()
        for role in NOT_OPERATORS:
            token = (
                _agent_token(bus, role, node)
                if role in NODE_AGENTS
                else bus.token_file(service_account_of(role))
            )
            async with _raw(bus, token, role, node=node if role in NODE_AGENTS else "") as (
                attacker,
                errors,
            ):
                with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
                    await attacker.request(ALLOCATOR_SUBJECT, encode(RELEASE), timeout=1)
                assert await reported(errors, f'publish to "{ALLOCATOR_SUBJECT}"'), (role, errors)
        assert received == [], "the allocator received a release from a non-operator"
        # The operator's release, beside it, is answered.
        operator = bus.token_file(service_account_of("ultraserver-operator"))
        async with _as(bus, operator, "ultraserver-operator") as connected:
            answered = await request(connected, ALLOCATOR_SUBJECT, RELEASE, wait=5)
        assert answered == RELEASE
        assert received == [encode(RELEASE)]
        assert allocator_errors == []
    # And a non-operator sees the refusal as an error, not as an answer.
    reader = bus.token_file(service_account_of("reader"))
    async with _as(bus, reader, "reader") as connected:
        with pytest.raises(RpcError):
            await request(connected, ALLOCATOR_SUBJECT, RELEASE, wait=1)


async def test_no_identity_but_the_admin_changes_streams_or_deletes_consumers(
    authenticated_bus: AuthenticatedBus,
) -> None:
    bus = authenticated_bus
    admin = await _declared(bus)
    node = _nodes(bus)[0]
    spec = consumer("health-monitor-heartbeats")
    async with _as(bus, admin, "admin") as connected:
        await connected.reconcile(streams=(), consumers=[spec])
        await connected.js.publish(heartbeat(node).subject, encode(heartbeat(node)), timeout=5)
    before = await _messages(bus, admin)
    roles: tuple[Role, ...] = (*NODE_AGENTS, *CLUSTER_SERVICES, "reader")
    for role in roles:
        agent = role in NODE_AGENTS
        token = _agent_token(bus, role, node) if agent else bus.token_file(service_account_of(role))
        async with _raw(bus, token, role, node=node if agent else "") as (nc, errors):
            js = nc.jetstream(timeout=0.5)
            attempts = {
                f"STREAM.PURGE.{HEARTBEAT.name}": js.purge_stream(HEARTBEAT.name),
                f"STREAM.DELETE.{HEARTBEAT.name}": js.delete_stream(HEARTBEAT.name),
                f"STREAM.UPDATE.{HEARTBEAT.name}": js.update_stream(
                    api.StreamConfig(name=HEARTBEAT.name, subjects=["neuron.heartbeat.>"])
                ),
                "STREAM.CREATE.NEURON_EXTRA": js.add_stream(name="NEURON_EXTRA", subjects=["x"]),
                f"CONSUMER.DELETE.{spec.stream}.{spec.durable}": js.delete_consumer(
                    spec.stream, spec.durable
                ),
            }
            for verb, attempt in attempts.items():
                with pytest.raises(nats.errors.TimeoutError):
                    await attempt
                assert await reported(errors, f'publish to "$JS.API.{verb}"'), (role, errors)
    assert await _messages(bus, admin) == before
    async with _as(bus, admin, "admin") as connected:
        info = await connected.js.consumer_info(spec.stream, spec.durable)
        assert info.name == spec.durable
        names = {s.config.name for s in await connected.js.streams_info()}
        assert names == {s.name for s in STREAMS}
        # The admin, the declare step's identity, beside it: may delete the consumer.
        assert await connected.js.delete_consumer(spec.stream, spec.durable)


async def test_the_account_has_at_most_its_streams_and_consumers_per_stream(
    authenticated_bus: AuthenticatedBus,
) -> None:
    """auth.conf's NEURON limits as deployed: past max_streams even the admin is refused; past
    max_consumers a reader's next projection on a stream is refused; nothing is left behind."""
    bus = authenticated_bus
    limits = neuron_limits()
    max_streams, max_consumers = int(limits["max_streams"]), int(limits["max_consumers"])
    assert max_streams >= len(STREAMS)
    admin = await _declared(bus)
    async with _as(bus, admin, "admin") as connected:
        for i in range(max_streams - len(STREAMS)):
            await connected.js.add_stream(name=f"SPARE_{i}", subjects=[f"spare.{i}"])
        with pytest.raises(APIError) as caught:
            await connected.js.add_stream(name="ONE_TOO_MANY", subjects=["spare.more"])
        assert "maximum number of streams reached" in str(caught.value.description)
        assert len(await connected.js.streams_info()) == max_streams

    reader = bus.token_file(service_account_of("reader"))
    async with _raw(bus, reader, "reader") as (nc, _errors):

        async def create(i: int) -> dict[str, object]:
            config = {
                "deliver_subject": f"{inbox_prefix('reader')}.c{i}",
                "ack_policy": "none",
                "inactive_threshold": 600 * 1_000_000_000,
                "mem_storage": True,
                "num_replicas": 1,
            }
            body = json.dumps({"stream_name": HEALTH.name, "config": config}).encode()
            reply = await nc.request(f"$JS.API.CONSUMER.CREATE.{HEALTH.name}", body, timeout=10)
            answer: dict[str, object] = json.loads(reply.data)
            return answer

        for start in range(0, max_consumers, 256):
            answers = await asyncio.gather(
                *(create(i) for i in range(start, min(start + 256, max_consumers)))
            )
            assert all("error" not in a for a in answers), next(a for a in answers if "error" in a)
        over = await create(max_consumers)
        error = over.get("error")
        assert isinstance(error, dict), over
        assert "maximum consumers limit reached" in str(error.get("description")), over
    async with _as(bus, admin, "admin") as connected:
        info = await connected.js.stream_info(HEALTH.name)
        assert info.state.consumer_count == max_consumers
        # Another stream, beside it, still takes its own consumers.
        inventory = await connected.js.stream_info(INVENTORY.name)
        assert inventory.state.consumer_count == 0


async def test_a_publisher_cannot_store_past_the_accounts_file_limit(
    small_store_bus: AuthenticatedBus,
) -> None:
    """auth.conf with max_file at 64 KiB: discovery's own inventory, beside it, is stored; one
    larger than what the account has left is refused with the server's error, and what was
    stored stays."""
    bus = small_store_bus
    admin = await _declared(bus)
    node = _nodes(bus)[0]
    token = _agent_token(bus, "discovery", node)
    subject = f"neuron.inventory.{subject_token(node)}"
    async with _raw(bus, token, "discovery", node=node) as (nc, _errors):
        js = nc.jetstream(timeout=5)
        # Stored: the legitimate publish.
        assert (await js.publish(subject, b"x" * 1024)).stream == INVENTORY.name
        with pytest.raises(APIError) as caught:
            await js.publish(subject, b"y" * 96 * 1024)
        assert caught.value.err_code == 10002, caught.value
        assert caught.value.description == "resource limits exceeded for account"
    counts = await _messages(bus, admin)
    assert counts[INVENTORY.name] == 1
    async with _as(bus, admin, "admin") as connected:
        # Stored in its bucket (neuron.inventory.<bucket>.<node>).
        stored = await connected.js.get_last_msg(
            INVENTORY.name, f"neuron.inventory.*.{subject_token(node)}"
        )
        assert stored.data == b"x" * 1024
