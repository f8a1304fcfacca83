"""The alerts service's Alertmanager client against a real Alertmanager: alerts sent are the
ones Alertmanager shows, behind a route prefix too; a server that does not answer in time or
at all is an AlertmanagerError naming the URL, never a hang."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from neuron_dra_alerts.alertmanager import AlertmanagerClient, AlertmanagerError, PostableAlert
from neuron_dra_cli.stack import alerting, probes
from neuron_dra_cli.toolbuild import ensure_alertmanager

from tests.fixtures.subscribers import Alertmanager


@pytest.fixture
def prefixed_alertmanager(tmp_path: Path) -> Iterator[Alertmanager]:
    """An Alertmanager served under /ops/alertmanager, as behind a shared ingress."""
    binary = ensure_alertmanager(progress=lambda _: None)
    component = alerting.alertmanager(binary=binary, state_dir=tmp_path)
    port = component.ports["web"]
    component = dataclasses.replace(
        component,
        argv=[*component.argv, "--web.route-prefix=/ops/alertmanager"],
        ready=lambda: probes.http_ok(f"http://127.0.0.1:{port}/ops/alertmanager/-/ready"),
    )
    am = Alertmanager(component, tmp_path / "alertmanager.log")
    am.url = f"http://127.0.0.1:{port}/ops/alertmanager"
    am.start()
    try:
        yield am
    finally:
        am.stop()


def _alert(device: str) -> PostableAlert:
    now = datetime.now(UTC)
    return PostableAlert(
        labels={"alertname": "NeuronDeviceUnhealthy", "device": device},
        annotations={"summary": f"{device} is unhealthy"},
        starts_at=now,
        ends_at=now + timedelta(minutes=5),
    )


async def test_sent_alerts_are_shown_behind_a_route_prefix(
    prefixed_alertmanager: Alertmanager,
) -> None:
    client = AlertmanagerClient(prefixed_alertmanager.url + "/", timeout=5)
    try:
        await client.post([_alert("neurondevice3"), _alert("neurondevice4")])
        shown = await client.alerts(filters=['alertname="NeuronDeviceUnhealthy"'])
        assert sorted(a["labels"]["device"] for a in shown) == ["neurondevice3", "neurondevice4"]
        assert [a["labels"]["device"] for a in prefixed_alertmanager.active()] != []
    finally:
        await client.close()


async def test_an_error_answer_is_quoted() -> None:
    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        body = b"bad alert: missing labels"
        writer.write(
            b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(refuse, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = AlertmanagerClient(f"http://127.0.0.1:{port}", timeout=5)
    try:
        with pytest.raises(AlertmanagerError, match="HTTP 400: bad alert: missing labels"):
            await client.post([_alert("neurondevice0")])
    finally:
        await client.close()
        server.close()
        await server.wait_closed()


async def test_a_silent_or_absent_server_is_an_error_within_the_timeout() -> None:
    # Accepts the connection and never answers.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    port = silent.getsockname()[1]
    client = AlertmanagerClient(f"http://127.0.0.1:{port}", timeout=0.5)
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(AlertmanagerError, match=f"POST http://127.0.0.1:{port}/api/v2/alerts"):
            await client.post([_alert("neurondevice0")])
        assert loop.time() - started < 3
    finally:
        await client.close()
        silent.close()
    # Nothing listens there any more.
    client = AlertmanagerClient(f"http://127.0.0.1:{port}", timeout=5)
    try:
        with pytest.raises(AlertmanagerError, match="GET"):
            await client.alerts()
    finally:
        await client.close()
