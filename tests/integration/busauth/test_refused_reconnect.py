"""A NATS server restarts and a service reconnects before the auth callout does: the server
admits the connection, waits for the callout's answer in vain and ends it with an
authorization error, which nats-py does not retry. The service must not stay half alive: it
says so and starts again in its own process, and then answers as before."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from neuron_dra_bus_auth.identities import service_account_of
from neuron_dra_common.bus import Bus, BusCredentials, inbox_prefix, request
from neuron_dra_common.events import AllocationDecided, AllocationRequested, ObjectRef

from tests.integration.busauth.conftest import AuthenticatedBus

pytestmark = pytest.mark.stack


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def _poll(what: str, check: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} within {seconds} s")
        time.sleep(0.25)


async def _wait(what: str, check: Callable[[], bool], seconds: float) -> None:
    await asyncio.to_thread(_poll, what, check, seconds)


async def _allocate(bus: AuthenticatedBus, name: str) -> object:
    token = bus.token_file(service_account_of("ultraserver-operator"))
    connected = await Bus.connect(
        [bus.url],
        name="ultraserver-operator",
        credentials=BusCredentials(token_file=str(token)),
        inbox=inbox_prefix("ultraserver-operator"),
    )
    try:
        return await request(
            connected,
            "neuron.rpc.allocator",
            AllocationRequested(
                request_id=name,
                workload=ObjectRef(namespace="default", name=name, uid=f"uid-{name}"),
                topology_size=4,
            ),
            wait=10,
        )
    finally:
        await connected.close()


async def test_a_service_the_server_refuses_after_a_restart_starts_again(
    authenticated_bus: AuthenticatedBus, tmp_path: Path
) -> None:
    bus = authenticated_bus
    admin = bus.token_file(service_account_of("admin"))
    declared = await Bus.connect(
        [bus.url],
        name="admin",
        credentials=BusCredentials(token_file=str(admin)),
        inbox=inbox_prefix("admin"),
    )
    await declared.reconcile()
    await declared.close()
    log = tmp_path / "allocator.log"
    token = bus.token_file(service_account_of("topology-allocator"))
    with bus.service("neuron_dra_topology_allocator", token=token, log=log) as port:
        assert isinstance(await _allocate(bus, "before"), AllocationDecided)
        # The callout is slower than its clients: paused while the server restarts, so the
        # allocator's reconnection reaches a server with nobody to answer for it.
        os.kill(bus.callout.pid, signal.SIGSTOP)
        try:
            await bus.server.restart_async(down_for=1.0)
            await _wait(
                "the allocator told its connection ended",
                lambda: "connection for good" in log.read_text(errors="replace"),
                seconds=60,
            )
        finally:
            os.kill(bus.callout.pid, signal.SIGCONT)
        await _wait(
            "the allocator started again",
            lambda: "starting the service again" in log.read_text(errors="replace"),
            seconds=30,
        )
        await _wait("the allocator ready again", lambda: _ready(port), seconds=60)
        assert isinstance(await _allocate(bus, "after"), AllocationDecided)
