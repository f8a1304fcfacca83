"""A bus client given a CA speaks TLS to a server that requires it, and sends its token."""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.request
from pathlib import Path
from typing import Any

from neuron_dra_cli.stack.pki import Pki
from neuron_dra_common.bus import Bus, BusCredentials

from tests.fixtures.nats import NatsServer


def _connections(monitor_port: int) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{monitor_port}/connz", timeout=5) as resp:
        connections: list[dict[str, Any]] = json.load(resp)["connections"]
    return connections


async def test_tls_with_the_configured_ca_and_a_token(tmp_path: Path) -> None:
    pki = Pki(tmp_path / "pki")
    serving = pki.apiserver()  # a serving certificate for localhost and 127.0.0.1
    config = tmp_path / "nats.conf"
    config.write_text(
        f'tls {{ cert_file: "{serving.cert}", key_file: "{serving.key}" }}\n'
        'authorization { token: "the-token" }\n'
    )
    store = tmp_path / "jetstream"
    store.mkdir()
    server = NatsServer(store_dir=store, log_file=tmp_path / "nats-server.log", config=config)
    server.start()
    token = tmp_path / "token"
    token.write_text("the-token")
    credentials = BusCredentials(token_file=str(token), tls_ca=str(pki.ca.cert))
    bus = await Bus.connect(
        [f"tls://127.0.0.1:{server.port}"], name="tls-client", credentials=credentials
    )
    try:
        changes = await bus.reconcile()
        assert set(changes.values()) == {"created"}
        # The server's own view of the connection: which TLS version it speaks.
        connections = await asyncio.to_thread(_connections, server.monitor_port)
        assert [c["name"] for c in connections] == ["tls-client"]
        assert connections[0]["tls_version"].startswith("1.")
    finally:
        with contextlib.suppress(Exception):
            await bus.close()
        server.stop()
