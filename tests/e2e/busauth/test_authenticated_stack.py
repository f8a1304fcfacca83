"""The local stack with the authenticated bus: every service runs with nothing but its own
identity's grants and the product works as before; what an attacker on the open bus did is refused
by the running server, and each refusal is in the callout's or the server's log."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import nats.errors
import pytest
from neuron_dra_cli.stack import busauth
from neuron_dra_cli.stack.fleet import load_fleet
from neuron_dra_common.bus import Bus, BusCredentials
from neuron_dra_common.bus.declarations import INVENTORY, STREAMS
from neuron_dra_common.bus.rpc import ALLOCATOR_SUBJECT
from neuron_dra_common.events import NodeInventory, subject_token
from neuron_dra_common.events.codec import decode

from tests.e2e.actuate.pods import claim_pod
from tests.fixtures.natsclients import client, refused, reported
from tests.fixtures.stack import KubeStack, neuron_dra

pytestmark = pytest.mark.stack

DRIVER = "neuron.aws.com"


def _files(stack: KubeStack) -> busauth.BusAuth:
    return busauth.BusAuth(stack.state_dir / "bus-auth")


def _tls(stack: KubeStack) -> ssl.SSLContext:
    """Trust the stack's CA, which signed NATS's certificate."""
    return ssl.create_default_context(cafile=str(_files(stack).tls_ca))


def _trn2_nodes(stack: KubeStack) -> list[str]:
    state = json.loads((stack.state_dir / "state.json").read_text())
    fleet = load_fleet(Path(state["fleet"]))
    return [n.name for n in fleet.nodes if n.managed and n.instance_type == "trn2.48xlarge"]


def _log(stack: KubeStack, name: str) -> str:
    return (stack.state_dir / "logs" / f"{name}.log").read_text(errors="replace")


def _logged(stack: KubeStack, name: str, text: str, *, timeout: float = 30) -> str:
    """The line of component ``name``'s log that holds ``text``, waited for."""

    def line() -> str:
        return next((x for x in _log(stack, name).splitlines() if text in x), "")

    found: str = stack.wait_for(f"{name}'s log to say {text!r}", line, timeout=timeout)
    return found


@contextlib.asynccontextmanager
async def _admin(stack: KubeStack) -> AsyncIterator[Bus]:
    token = _files(stack).token(busauth.ADMIN)
    bus = await Bus.connect(
        [stack.nats_url],
        name="test-admin",
        credentials=BusCredentials(token_file=str(token), tls_ca=str(_files(stack).tls_ca)),
    )
    try:
        yield bus
    finally:
        await bus.close()


def test_the_product_runs_with_each_service_on_its_own_grants(bus_auth_stack: KubeStack) -> None:
    stack = bus_auth_stack
    node = _trn2_nodes(stack)[0]

    def slice_devices() -> set[str]:
        return {
            d["name"]
            for s in stack.get_json("resourceslices")["items"]
            if s["spec"]["driver"] == DRIVER and s["spec"]["pool"]["name"] == node
            for d in s["spec"].get("devices", ())
        }

    devices = stack.wait_for(f"the ResourceSlice of {node}", slice_devices, timeout=120)
    assert {f"neurondevice{i}" for i in range(16)} <= devices

    name = f"busauth-{uuid.uuid4().hex[:6]}"
    manifest = {"apiVersion": "v1", "kind": "List", "items": claim_pod(name, node=node, count=4)}
    stack.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    stack.wait_for(
        f"pod {name} to run",
        lambda: stack.get_json("pod", name)["status"].get("phase") == "Running",
        timeout=120,
    )
    [claim] = [
        c
        for c in stack.get_json("resourceclaims")["items"]
        if any(o["name"] == name for o in c["metadata"].get("ownerReferences", ()))
    ]
    results = claim["status"]["allocation"]["devices"]["results"]
    assert len(results) == 4
    assert {(r["driver"], r["pool"]) for r in results} == {(DRIVER, node)}

    # Each service was admitted as its own identity and never needed more.
    callout = _log(stack, busauth.KIND)
    for identity in (f"discovery@{node}", f"kubelet-plugin@{node}", "slice-publisher", "audit"):
        assert f'"identity":"{identity}"' in callout, identity
    for log in (stack.state_dir / "logs").glob("*.log"):
        if log.stem in ("nats", busauth.KIND):
            continue
        assert "permissions violation" not in log.read_text(errors="replace").lower(), log.name
    stack.kubectl("delete", "pod", name, "--wait=false")


async def test_a_node_agent_cannot_publish_another_nodes_inventory(
    bus_auth_stack: KubeStack,
) -> None:
    stack = bus_auth_stack
    own, other = _trn2_nodes(stack)[:2]
    other_subject = f"neuron.inventory.{subject_token(other)}"
    async with _admin(stack) as admin:
        before = await stack_last(admin, other_subject)

    # The token the stack gave discovery on `own`, bound to its pod there.
    token = _files(stack).token("neuron-dra-discovery", own).read_text()
    errors: list[str] = []
    agent = await client(stack.nats_url, token=token, errors=errors, tls=_tls(stack))
    forged = b'{"forged": true}'
    await agent.publish(other_subject, forged)
    await agent.flush()
    assert await reported(errors, f'publish to "{other_subject}"'), errors
    await agent.close()
    _logged(stack, "nats", f'user:discovery@{own}" - Publish Violation - Subject "{other_subject}"')

    async with _admin(stack) as admin:
        after = await stack_last(admin, other_subject)
    assert after == before
    inventory = decode(after)
    assert isinstance(inventory, NodeInventory)
    assert inventory.node == other


async def stack_last(admin: Bus, subject: str) -> bytes:
    """The last message stored for ``subject`` in the inventory stream (which files it in a
    bucket, ``neuron.inventory.<bucket>.<node>``)."""
    root, node = subject.rsplit(".", 1)
    stored = await admin.js.get_last_msg(INVENTORY.name, f"{root}.*.{node}")
    return bytes(stored.data or b"")


async def test_a_workload_cannot_call_the_allocator(bus_auth_stack: KubeStack) -> None:
    stack = bus_auth_stack
    node = _trn2_nodes(stack)[0]
    pod = f"workload-{uuid.uuid4().hex[:6]}"
    stack.kubectl(
        "run",
        pod,
        "--image=busybox",
        "--restart=Never",
        f"--overrides={json.dumps({'spec': {'nodeName': node}})}",
    )
    # The workload's own projected token, as the kubelet would mount it for the bus.
    token = stack.kubectl(
        "create",
        "token",
        "default",
        f"--audience={busauth.AUDIENCE}",
        "--bound-object-kind=Pod",
        f"--bound-object-name={pod}",
    ).stdout.strip()
    assert "authorization violation" in await refused(stack.nats_url, token=token, tls=_tls(stack))
    _logged(stack, busauth.KIND, "ServiceAccount default/default has no bus identity")

    # Nor with its token for the apiserver.
    api_token = stack.kubectl("create", "token", "default").stdout.strip()
    assert "authorization violation" in await refused(
        stack.nats_url, token=api_token, tls=_tls(stack)
    )
    _logged(stack, busauth.KIND, "token not authenticated")

    # A node agent's identity, admitted, may not ask the allocator either.
    errors: list[str] = []
    agent = await client(
        stack.nats_url,
        token=_files(stack).token("neuron-dra-discovery", node).read_text(),
        errors=errors,
        tls=_tls(stack),
    )
    with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
        await agent.request(ALLOCATOR_SUBJECT, b"release someone else's UltraServer", timeout=1)
    assert await reported(errors, f'publish to "{ALLOCATOR_SUBJECT}"'), errors
    await agent.close()
    _logged(
        stack, "nats", f'user:discovery@{node}" - Publish Violation - Subject "{ALLOCATOR_SUBJECT}"'
    )
    stack.kubectl("delete", "pod", pod, "--wait=false")


async def test_no_service_can_purge_a_stream(bus_auth_stack: KubeStack) -> None:
    stack = bus_auth_stack
    async with _admin(stack) as admin:
        counts = {s.name: (await admin.js.stream_info(s.name)).state.messages for s in STREAMS}
    assert counts[INVENTORY.name] > 0
    services = [
        t for t in sorted(_files(stack).tokens.glob("*.token")) if busauth.ADMIN not in t.name
    ]
    assert len(services) >= 9
    for token in services:
        errors: list[str] = []
        service = await client(
            stack.nats_url, token=token.read_text(), errors=errors, tls=_tls(stack)
        )
        js = service.jetstream(timeout=1)
        with pytest.raises(nats.errors.TimeoutError):
            await js.purge_stream(INVENTORY.name)
        assert await reported(errors, f'publish to "$JS.API.STREAM.PURGE.{INVENTORY.name}"'), (
            token.name,
            errors,
        )
        await service.close()
        # The server logs it under the identity the callout granted (role, or role@node).
        identity = token.name.removeprefix("neuron-dra-").removesuffix(".token")
        identity = identity.removeprefix("bus-")  # the reader's identity is `reader`
        purge = f"$JS.API.STREAM.PURGE.{INVENTORY.name}"
        _logged(stack, "nats", f'user:{identity}" - Publish Violation - Subject "{purge}"')
    async with _admin(stack) as admin:
        after = (await admin.js.stream_info(INVENTORY.name)).state.messages
    # Nothing was taken away (discovery keeps adding heartbeats and inventories meanwhile).
    assert after >= counts[INVENTORY.name]


async def _plain_exchange(url: str, line: bytes) -> tuple[dict[str, object], bytes]:
    """The server's INFO, then what it answers to ``line`` sent without TLS."""
    host, _, port = url.removeprefix("nats://").rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        info = json.loads((await reader.readline()).removeprefix(b"INFO "))
        writer.write(line)
        await writer.drain()
        try:
            answer = await asyncio.wait_for(reader.read(4096), 10)
        except ConnectionResetError:  # the server wanted a TLS handshake and hung up
            answer = b""
    finally:
        writer.close()
    return info, answer


async def test_the_bus_speaks_only_tls_so_no_token_crosses_in_clear(
    bus_auth_stack: KubeStack,
) -> None:
    stack = bus_auth_stack
    token = _files(stack).token("neuron-dra-slice-publisher").read_text()
    info, answer = await _plain_exchange(
        stack.nats_url, b'CONNECT {"auth_token":"' + token.encode() + b'"}\r\nPING\r\n'
    )
    assert info["tls_required"] is True
    # Not admitted: no PONG, the connection dropped, and the server says why in its log.
    assert b"PONG" not in answer, answer
    _logged(stack, "nats", "TLS handshake error")
    # The handshake succeeds only for a client that trusts the stack's CA.
    assert await _handshake(stack.nats_url, _tls(stack)) == ""
    assert "certificate verify failed" in await _handshake(
        stack.nats_url, ssl.create_default_context()
    )


async def _handshake(url: str, context: ssl.SSLContext) -> str:
    """Read the server's INFO and upgrade to TLS with ``context``: '' or why it failed."""
    host, _, port = url.removeprefix("nats://").rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        await reader.readline()
        await asyncio.wait_for(writer.start_tls(context, server_hostname=host), 10)
    except ssl.SSLError as exc:
        return str(exc)
    finally:
        writer.transport.abort()
    return ""


def test_events_reads_the_audit_stream_as_the_reader_who_may_not_write(
    bus_auth_stack: KubeStack,
) -> None:
    stack = bus_auth_stack
    node = _trn2_nodes(stack)[0]
    # On this stack the command finds its reader's token and the CA by itself.
    out = neuron_dra(
        "events", "--state-dir", str(stack.state_dir), "--node", node, "-o", "json", timeout=120
    )
    assert out.returncode == 0, out.stderr
    events = [json.loads(line) for line in out.stdout.splitlines()]
    inventories = [e for e in events if e["type"] == "com.aws.neuron.node.inventory.v1"]
    assert inventories, events[:3]
    assert {e["subject"] for e in inventories} == {f"nodes/{node}"}
    _logged(stack, busauth.KIND, '"identity":"reader"')

    async def write_as_reader() -> list[str]:
        errors: list[str] = []
        reader = await client(
            stack.nats_url,
            token=_files(stack).token(busauth.READER).read_text(),
            errors=errors,
            tls=_tls(stack),
        )
        await reader.publish(f"neuron.inventory.{subject_token(node)}", b"{}")
        await reader.flush()
        await reported(errors, "publish to")
        await reader.close()
        return errors

    errors = asyncio.run(write_as_reader())
    assert any("permissions violation for publish" in e.lower() for e in errors), errors
