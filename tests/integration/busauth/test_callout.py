"""The authenticated bus, as its clients see it: real nats-server, real callout process, real
apiserver issuing and reviewing ServiceAccount tokens."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.aio.msg import Msg
from nats.js import api
from nats.js.errors import NotFoundError
from neuron_dra_bus_auth.identities import NODE_NAME_EXTRA, service_account_of
from neuron_dra_bus_auth.permissions import (
    ALLOCATOR_QUEUE,
    ALLOCATOR_SUBJECT,
    CLUSTER_SERVICES,
    Role,
)
from neuron_dra_common.bus import (
    Bus,
    BusCredentials,
    Delivery,
    consumer,
    inbox_prefix,
    replay,
    request,
)
from neuron_dra_common.bus.declarations import INVENTORY, STREAMS, deliver_subject
from neuron_dra_common.events import (
    AllocationDecided,
    AllocationRequested,
    NodeInventory,
    ObjectRef,
    subject_token,
)
from neuron_dra_common.events.codec import decode
from neuron_dra_common.hardware.simulate import write_node

from tests.contracts.support import heartbeat, running, wait_until
from tests.fixtures.natsclients import client, refused, reported, violated
from tests.integration.busauth.conftest import AuthenticatedBus

pytestmark = pytest.mark.stack


def _bucketed(subject: str) -> str:
    """Where the inventory stream files what is published on ``subject``: in a bucket,
    ``neuron.inventory.<bucket>.<node>``."""
    root, node = subject.rsplit(".", 1)
    return f"{root}.*.{node}"


async def _stored(reader: Bus, subject: str, *, within: float = 15) -> bytes:
    """The last message of ``subject`` in the inventory stream, once there is one."""
    for _ in range(int(within / 0.2)):
        with contextlib.suppress(NotFoundError):
            stored = await reader.js.get_last_msg(INVENTORY.name, subject)
            if stored.data:
                return stored.data
        await asyncio.sleep(0.2)
    raise AssertionError(f"nothing stored on {subject} within {within} s")


def _nodes(bus: AuthenticatedBus) -> list[str]:
    items = bus.stack.get_json("nodes")["items"]
    return sorted(item["metadata"]["name"] for item in items)


@contextlib.asynccontextmanager
async def _bus(
    bus: AuthenticatedBus, token: Path, *, name: Role, node: str = ""
) -> AsyncIterator[Bus]:
    """Connected as identity ``name`` (of ``node``), with that identity's reply inbox."""
    connected = await Bus.connect(
        [bus.url],
        name=name,
        credentials=BusCredentials(token_file=str(token)),
        inbox=inbox_prefix(name, node=node),
    )
    try:
        yield connected
    finally:
        await connected.close()


async def _declared(bus: AuthenticatedBus) -> Path:
    """Streams declared by the admin identity, as an install would; the admin's token."""
    admin = bus.token_file(service_account_of("admin"))
    async with _bus(bus, admin, name="admin") as connected:
        changes = await connected.reconcile()
    assert changes[INVENTORY.name] == "created"
    return admin


async def test_a_node_agent_publishes_its_own_inventory_and_not_another_nodes(
    authenticated_bus: AuthenticatedBus, caplog: pytest.LogCaptureFixture
) -> None:
    bus = authenticated_bus
    admin = await _declared(bus)
    own, other = _nodes(bus)[:2]
    discovery = service_account_of("discovery")
    token = bus.token_file(discovery, pod=bus.pod_on(own, service_account=discovery))
    own_subject = f"neuron.inventory.{subject_token(own)}"
    other_subject = f"neuron.inventory.{subject_token(other)}"

    caplog.set_level(logging.WARNING, logger="neuron_dra_common.bus.connection")
    async with _bus(bus, token, name="discovery", node=own) as agent:
        ack = await agent.js.publish(own_subject, b"{}", timeout=5)
        assert ack.stream == INVENTORY.name
        with pytest.raises(nats.errors.TimeoutError):
            await agent.js.publish(other_subject, b"{}", timeout=2)
    bus.callout_says(f"discovery@{own}")
    violations = [getattr(r, "error", "") for r in caplog.records]
    assert violated(violations, f'publish to "{other_subject}"'), violations

    async with _bus(bus, admin, name="admin") as reader:
        # Stored in its bucket (neuron.inventory.<bucket>.<node>).
        stored = await reader.js.get_last_msg(INVENTORY.name, _bucketed(own_subject))
        assert stored.data == b"{}"
        with pytest.raises(NotFoundError):
            await reader.js.get_last_msg(INVENTORY.name, _bucketed(other_subject))


async def test_a_node_agent_without_a_pod_bound_token_isrefused(
    authenticated_bus: AuthenticatedBus,
) -> None:
    bus = authenticated_bus
    token = bus.token_file(service_account_of("kubelet-plugin")).read_text()
    assert "authorization violation" in await refused(bus.url, token=token)
    bus.callout_says(f"token carries no {NODE_NAME_EXTRA}")


async def test_a_bad_token_and_no_token_arerefused(authenticated_bus: AuthenticatedBus) -> None:
    bus = authenticated_bus
    assert "authorization violation" in await refused(bus.url, token="not-a-token")
    bus.callout_says("token not authenticated")
    assert "authorization violation" in await refused(bus.url, token=None)
    bus.callout_says("no token: connect with the pod's projected ServiceAccount token")


async def test_a_workload_cannot_call_the_allocator_and_the_operator_can(
    authenticated_bus: AuthenticatedBus,
) -> None:
    bus = authenticated_bus
    await _declared(bus)
    # A workload's own ServiceAccount has no bus identity at all.
    workload = bus.token_file("default").read_text()
    assert "authorization violation" in await refused(bus.url, token=workload)
    bus.callout_says(f"ServiceAccount {bus.namespace}/default has no bus identity")

    async def answer(msg: Msg) -> None:
        await msg.respond(b"decided")

    allocator_errors: list[str] = []
    allocator = await client(
        bus.url,
        token=bus.token_file(service_account_of("topology-allocator")).read_text(),
        errors=allocator_errors,
    )
    await allocator.subscribe(ALLOCATOR_SUBJECT, queue=ALLOCATOR_QUEUE, cb=answer)
    await allocator.flush()

    # A client with a bus identity, but not the operator's: neither asks nor answers.
    errors: list[str] = []
    reader = await client(
        bus.url, token=bus.token_file(service_account_of("reader")).read_text(), errors=errors
    )
    with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
        await reader.request(ALLOCATOR_SUBJECT, b"release someone else's UltraServer", timeout=1)
    await reader.subscribe(ALLOCATOR_SUBJECT, queue=ALLOCATOR_QUEUE)
    assert await reported(errors, f'subscription to "{ALLOCATOR_SUBJECT}'), errors
    await reader.close()
    assert violated(errors, f'publish to "{ALLOCATOR_SUBJECT}"'), errors

    operator = await client(
        bus.url,
        token=bus.token_file(service_account_of("ultraserver-operator")).read_text(),
        errors=[],
        inbox=inbox_prefix("ultraserver-operator"),
    )
    reply = await operator.request(ALLOCATOR_SUBJECT, b"allocate", timeout=5)
    assert reply.data == b"decided"
    await operator.close()
    await allocator.close()
    assert allocator_errors == []


async def test_no_service_purges_or_deletes_a_stream_and_admin_does(
    authenticated_bus: AuthenticatedBus,
) -> None:
    bus = authenticated_bus
    admin = await _declared(bus)
    own = _nodes(bus)[0]
    discovery = service_account_of("discovery")
    agent_token = bus.token_file(discovery, pod=bus.pod_on(own, service_account=discovery))
    async with _bus(bus, agent_token, name="discovery", node=own) as agent:
        await agent.js.publish(f"neuron.inventory.{subject_token(own)}", b"{}", timeout=5)

    roles: tuple[Role, ...] = (*CLUSTER_SERVICES, "reader")
    tokens = [bus.token_file(service_account_of(role)) for role in roles]
    for token in (agent_token, *tokens):
        errors: list[str] = []
        service = await client(bus.url, token=token.read_text(), errors=errors)
        js = service.jetstream(timeout=1)
        with pytest.raises(nats.errors.TimeoutError):
            await js.purge_stream(INVENTORY.name)
        with pytest.raises(nats.errors.TimeoutError):
            await js.delete_stream(INVENTORY.name)
        await service.close()
        assert violated(errors, f'publish to "$JS.API.STREAM.PURGE.{INVENTORY.name}"'), errors
        assert violated(errors, f'publish to "$JS.API.STREAM.DELETE.{INVENTORY.name}"'), errors

    async with _bus(bus, admin, name="admin") as connected:
        assert (await connected.js.stream_info(INVENTORY.name)).state.messages == 1
        assert await connected.js.purge_stream(INVENTORY.name)
        assert (await connected.js.stream_info(INVENTORY.name)).state.messages == 0
        assert await connected.js.delete_stream(INVENTORY.name)


async def test_a_cluster_service_starts_on_streams_the_admin_declared(
    authenticated_bus: AuthenticatedBus,
) -> None:
    bus = authenticated_bus
    await _declared(bus)
    token = bus.token_file(service_account_of("slice-publisher"))
    async with _bus(bus, token, name="slice-publisher") as service:
        durable = consumer("slice-publisher-inventory")
        changes = await service.reconcile(consumers=[durable])
        assert changes[INVENTORY.name] == "unchanged"
        assert changes[f"{INVENTORY.name}/{durable.durable}"] == "created"
        events = await replay(
            service, name=durable.durable, stream=INVENTORY.name, subject=INVENTORY.subjects[0]
        )
        assert events == []


async def test_the_allocator_and_audit_run_with_their_identities(
    authenticated_bus: AuthenticatedBus, tmp_path: Path
) -> None:
    """The real processes start on the admin's streams with nothing but their own grants, and
    the operator's request is answered by the allocator through the bus."""
    bus = authenticated_bus
    await _declared(bus)
    allocator = bus.token_file(service_account_of("topology-allocator"))
    audit = bus.token_file(service_account_of("audit"))
    with (
        bus.service(
            "neuron_dra_topology_allocator", token=allocator, log=tmp_path / "allocator.log"
        ),
        bus.service(
            "neuron_dra_audit",
            token=audit,
            log=tmp_path / "audit.log",
            env={"NEURON_DRA_AUDIT_FILE": str(tmp_path / "audit.jsonl")},
        ),
    ):
        operator = bus.token_file(service_account_of("ultraserver-operator"))
        async with _bus(bus, operator, name="ultraserver-operator") as connected:
            decided = await request(
                connected,
                ALLOCATOR_SUBJECT,
                AllocationRequested(
                    request_id="r1",
                    workload=ObjectRef(namespace="default", name="train", uid="u1"),
                    topology_size=4,
                ),
                wait=10,
            )
    assert isinstance(decided, AllocationDecided)
    assert decided.workload.name == "train"
    for log in ("allocator.log", "audit.log"):
        assert "permissions violation" not in (tmp_path / log).read_text().lower()


async def test_discovery_publishes_its_own_nodes_inventory_and_cannot_pose_as_another(
    authenticated_bus: AuthenticatedBus, tmp_path: Path
) -> None:
    """The real discovery process on a node: with its node's token it publishes that node's
    inventory; told it runs on another node, the server refuses it (that node's reply inbox,
    and that node's inventory) and nothing is stored for the other node."""
    bus = authenticated_bus
    admin = await _declared(bus)
    own, other = _nodes(bus)[:2]
    discovery = service_account_of("discovery")
    token = bus.token_file(discovery, pod=bus.pod_on(own, service_account=discovery))

    def env(node: str) -> dict[str, str]:
        sim = write_node(tmp_path / node, instance_type="trn2.48xlarge", node_name=node)
        return {
            "NEURON_DRA_NODE_NAME": node,
            "NEURON_DRA_HOST_ROOT": str(sim.root),
            "NEURON_DRA_NEURON_LS_COMMAND": ",".join(sim.neuron_ls_command),
        }

    with bus.service(
        "neuron_dra_discovery", token=token, log=tmp_path / "discovery.log", env=env(own)
    ):
        async with _bus(bus, admin, name="admin") as reader:
            data = await _stored(reader, _bucketed(f"neuron.inventory.{subject_token(own)}"))
    inventory = decode(data)
    assert isinstance(inventory, NodeInventory)
    assert inventory.node == own

    liar = tmp_path / "liar.log"
    other_subject = f"neuron.inventory.{subject_token(other)}"

    def refused_in_log() -> bool:
        # Told it runs on the other node, it takes that node's reply inbox, which its token's
        # identity may not read: the server refuses it before its first publish.
        errors = []
        for line in liar.read_text().splitlines() if liar.exists() else []:
            with contextlib.suppress(ValueError):  # a line still being written
                errors.append(str(json.loads(line).get("error", "")))
        inbox = inbox_prefix("discovery", node=other)
        return violated(errors, f'subscription to "{inbox}.') or violated(
            errors, f'publish to "{other_subject}"'
        )

    # It never gets ready (its inventory is refused): watch its log for the server's refusal.
    with bus.service(
        "neuron_dra_discovery", token=token, log=liar, env=env(other), wait_ready=False
    ):
        for _ in range(600):
            if refused_in_log():
                break
            await asyncio.sleep(0.1)
    assert refused_in_log(), liar.read_text()[-2000:]
    async with _bus(bus, admin, name="admin") as reader:
        with pytest.raises(NotFoundError):
            await reader.js.get_last_msg(INVENTORY.name, _bucketed(other_subject))


def _declare(bus: AuthenticatedBus, token: Path) -> subprocess.CompletedProcess[str]:
    """``neuron-dra-bus-declare`` run with ``token``, as the install's Job runs it."""
    return subprocess.run(
        [sys.executable, "-m", "neuron_dra_bus_auth.declare"],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **os.environ,
            "NEURON_DRA_NATS_SERVERS": bus.url,
            "NEURON_DRA_NATS_TOKEN_FILE": str(token),
            "NEURON_DRA_INSECURE_BUS": "1",  # no TLS on this server
            "NEURON_DRA_WAIT_SECONDS": "10",
        },
    )


def test_only_the_admin_declares_the_streams(authenticated_bus: AuthenticatedBus) -> None:
    """``neuron-dra-bus-declare``, the install step: as a service it fails naming the first
    stream; as the admin it creates every stream, and a second run changes nothing."""
    bus = authenticated_bus
    service = _declare(bus, bus.token_file(service_account_of("slice-publisher")))
    assert service.returncode == 1
    assert f"stream {STREAMS[0].name}: not declared" in service.stderr

    admin = bus.token_file(service_account_of("admin"))
    first = _declare(bus, admin)
    assert first.returncode == 0, first.stderr
    assert {f"{s.name}: created" for s in STREAMS} <= set(first.stdout.splitlines())
    again = _declare(bus, admin)
    assert {f"{s.name}: unchanged" for s in STREAMS} <= set(again.stdout.splitlines())


async def test_a_service_receives_its_consumers_deliveries_and_no_other_identity_can(
    authenticated_bus: AuthenticatedBus,
) -> None:
    """The server pushes a durable consumer's messages to a subject only its service may
    subscribe to, and only in its deliver group: another identity cannot take a share."""
    bus = authenticated_bus
    admin = await _declared(bus)
    spec = consumer("health-monitor-heartbeats")
    handled: list[str] = []

    async def handle(event: object, delivery: Delivery) -> None:
        handled.append(delivery.subject)

    detector = bus.token_file(service_account_of("failure-detector"))
    async with (
        _bus(bus, detector, name="failure-detector") as service,
        running(service.runner(spec, handle)),
    ):
        async with _bus(bus, admin, name="admin") as publisher:
            await publisher.publisher(source="/test").publish(heartbeat("node-1"))
        await wait_until(lambda: bool(handled), what="the heartbeat at the failure detector")
    assert handled == ["neuron.heartbeat.node-1"]

    subject = deliver_subject(spec)
    audit = bus.token_file(service_account_of("audit")).read_text()
    errors: list[str] = []
    nc = await client(bus.url, token=audit, errors=errors)
    try:
        await nc.subscribe(subject, queue=spec.durable)
        await nc.flush()
        assert await reported(errors, f'subscription to "{subject}"'), errors
    finally:
        await nc.close()


async def test_the_declare_step_replaces_an_earlier_releases_pull_consumer(
    authenticated_bus: AuthenticatedBus,
) -> None:
    """Release 0.1.0's durable consumers were pull consumers. A service may not delete one, so
    it says to run the declare step; the declare step replaces it from its ack floor."""
    bus = authenticated_bus
    admin = await _declared(bus)
    spec = consumer("health-monitor-heartbeats")
    async with _bus(bus, admin, name="admin") as connected:
        await connected.js.add_consumer(
            spec.stream,
            api.ConsumerConfig(durable_name=spec.durable, ack_policy=api.AckPolicy.EXPLICIT),
        )
        publisher = connected.publisher(source="/test")
        for node in ("node-1", "node-2"):
            await publisher.publish(heartbeat(node))
        old = await connected.js.pull_subscribe_bind(durable=spec.durable, stream=spec.stream)
        (first,) = await old.fetch(1, timeout=5)
        await first.ack_sync()
        await old.unsubscribe()

    detector = bus.token_file(service_account_of("failure-detector"))
    async with _bus(bus, detector, name="failure-detector") as service:
        with pytest.raises(RuntimeError, match="run the declare step"):
            await service.reconcile(streams=(), consumers=[spec])

    declared = _declare(bus, admin)
    assert declared.returncode == 0, declared.stderr
    assert f"{spec.stream}/{spec.durable}: recreated" in declared.stdout.splitlines()
    async with _bus(bus, detector, name="failure-detector") as service:
        assert await service.reconcile(streams=(), consumers=[spec]) == {
            f"{spec.stream}/{spec.durable}": "unchanged"
        }
        info = await service.js.consumer_info(spec.stream, spec.durable)
    assert info.config.deliver_subject == deliver_subject(spec)
    assert info.num_pending == 1, "only the heartbeat the old consumer did not ack is left"
