"""Upgrading an install that ran the open bus: its streams, their messages and the durable
consumers' positions, kept by a real NATS server in the global account, are in the account
NEURON (where the auth callout places every client) once the base's StatefulSet has started
with its init container and the authenticated configuration. Nothing is lost, nothing is
delivered twice."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from neuron_dra_bus_auth import keys
from neuron_dra_common.bus import Bus, consumer
from neuron_dra_common.events import NodeHeartbeat

from tests.fixtures.nats import NatsServer, free_port, nats_binary
from tests.integration.deploy.test_nats_config import _write_config
from tests.unit.deploy.test_kustomize import KUSTOMIZE, by_kind, render

#: A consumer of the audit stream (which sources every other), as the audit service runs it.
AUDIT = "audit"


def _jsz(port: int) -> dict[str, Any]:
    url = f"http://127.0.0.1:{port}/jsz?accounts=true&streams=true&consumers=true"
    with urllib.request.urlopen(url, timeout=5) as reply:
        found: dict[str, Any] = json.load(reply)
    return found


def _streams(jsz: dict[str, Any], account: str) -> dict[str, dict[str, Any]]:
    """Each stream of ``account``: its state and its consumers' positions."""
    for acc in jsz.get("account_details", ()):
        if acc["name"] == account:
            return {
                s["name"]: {
                    "messages": s["state"]["messages"],
                    "last_seq": s["state"]["last_seq"],
                    "consumers": {
                        c["name"]: (c["delivered"]["stream_seq"], c["ack_floor"]["stream_seq"])
                        for c in s.get("consumer_detail", ())
                    },
                }
                for s in acc.get("stream_detail", ())
            }
    return {}


async def _open_bus_with_history(store: Path, tmp_path: Path) -> int:
    """The old release: the open bus, its streams and the audit consumer declared, and
    heartbeats published that the audit consumer has not had yet; returns how many."""
    server = NatsServer(store_dir=store, log_file=tmp_path / "old.log")
    server.start()
    try:
        bus = await Bus.connect([server.url], name="old-release")
        try:
            await bus.reconcile(consumers=[consumer(AUDIT)])
            publisher = bus.publisher(source="/test/upgrade")
            for i in range(5):
                await publisher.publish(
                    NodeHeartbeat(node=f"n{i}", boot_id="b", sequence=i, sent_at=datetime.now(UTC))
                )
        finally:
            await bus.close()
        return 5
    finally:
        server.stop()


def test_the_open_bus_streams_move_to_the_authenticated_account(tmp_path: Path) -> None:
    store = tmp_path / "data"
    store.mkdir()
    published = asyncio.run(_open_bus_with_history(store, tmp_path))

    # The old server's state as its monitoring reported it, from its files (restarted open).
    old = NatsServer(store_dir=store, log_file=tmp_path / "old-again.log")
    old.start()
    try:
        before = _streams(_jsz(old.monitor_port), "$G")
    finally:
        old.stop()
    assert before["NEURON_HEARTBEAT"]["messages"] == published
    assert AUDIT in before["NEURON_AUDIT"]["consumers"]

    # The new release's StatefulSet: its init container, as rendered, on the same volume...
    docs = render(KUSTOMIZE / "base")
    pod = by_kind(docs, "StatefulSet")["nats"]["spec"]["template"]["spec"]
    [init] = pod["initContainers"]
    [mount] = init["volumeMounts"]
    script = init["command"][2].replace(mount["mountPath"] + "/", f"{store}/")
    moved = subprocess.run(
        [*init["command"][:2], script], capture_output=True, text=True, timeout=30
    )
    assert moved.returncode == 0, moved.stderr
    assert "moved the open bus's streams to account NEURON" in moved.stdout
    # ...run again (the pod restarts): it changes nothing.
    again = subprocess.run([*init["command"][:2], script], capture_output=True, text=True)
    assert (again.returncode, again.stdout) == (0, "")

    # ...then the server with the authenticated configuration.
    monitor = free_port()
    made = keys.new_keys()
    env = {
        "NEURON_DRA_BUS_AUTH_ISSUER": made.public_key,
        "NEURON_DRA_BUS_AUTH_PASSWORD": made.password,
    }
    replace = {
        "0.0.0.0:4222": f"127.0.0.1:{free_port()}",
        "127.0.0.1:8222": f"127.0.0.1:{monitor}",
        "store_dir: /data": f"store_dir: {store}",
    }
    (tmp_path / "config").mkdir()
    config = _write_config(docs, tmp_path / "config", env, replace=replace)
    with (tmp_path / "new.log").open("wb") as out:
        proc = subprocess.Popen(
            [str(nats_binary()), "-c", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "POD_NAME": "nats-0", **env},
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                after = _streams(_jsz(monitor), "NEURON")
                if after:
                    break
            except OSError:
                pass
            assert proc.poll() is None, (tmp_path / "new.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "new.log").read_text()
            time.sleep(0.2)
        # Every stream, message and consumer position is where the old server left it.
        assert after == before
    finally:
        proc.terminate()
        proc.wait(20)
