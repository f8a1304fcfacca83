"""A bus client whose token file changes uses the new token at its next reconnect, as a pod's
projected ServiceAccount token is rotated on disk by the kubelet."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

import pytest
from neuron_dra_common.bus import Bus, BusCredentials

from tests.fixtures.nats import NatsServer


def _token_only(token: str) -> str:
    return f'authorization {{ token: "{token}" }}\n'


async def test_a_rotated_token_is_used_at_the_next_reconnect(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = tmp_path / "nats.conf"
    config.write_text(_token_only("first-token"))
    store = tmp_path / "jetstream"
    store.mkdir()
    server = NatsServer(store_dir=store, log_file=tmp_path / "nats-server.log", config=config)
    server.start()
    token = tmp_path / "token"
    token.write_text("first-token\n")
    bus = await Bus.connect(
        [server.url], name="rotating", credentials=BusCredentials(token_file=str(token))
    )
    caplog.set_level(logging.INFO, logger="neuron_dra_common.bus.connection")
    try:
        await bus.nc.flush(timeout=2)
        # The server now takes only the new token, which is what the file holds by then.
        token.write_text("second-token\n")
        config.write_text(_token_only("second-token"))
        await server.restart_async()
        for _ in range(200):
            if "nats reconnected" in caplog.text:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"no reconnect with the rotated token in 20 s: {caplog.text}")
        await bus.nc.flush(timeout=2)
        assert bus.connected
    finally:
        with contextlib.suppress(Exception):
            await bus.close()
        server.stop()
