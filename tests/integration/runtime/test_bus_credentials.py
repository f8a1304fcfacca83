"""A service started without its bus credentials refuses to start, in one line naming the
settings it lacks; the named insecure mode connects to an open bus and says so at start.

Real processes (the audit subscriber, the auth callout) against a real NATS server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.fixtures.nats import NatsServer, free_port


def _connections(server: NatsServer) -> int:
    """How many clients the server has admitted since it started."""
    url = f"http://127.0.0.1:{server.monitor_port}/varz"
    with urllib.request.urlopen(url, timeout=5) as resp:
        return int(json.load(resp)["total_connections"])


def _run(module: str, env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``python -m module`` with only ``env`` of the bus settings; it must end by itself."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NEURON_DRA_")}
    return subprocess.run(
        [sys.executable, "-m", module],
        env={**clean, "NEURON_DRA_AUDIT_FILE": str(tmp_path / "audit.jsonl"), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("module", "given", "named"),
    [
        ("neuron_dra_audit", {}, ["NEURON_DRA_NATS_TOKEN_FILE", "NEURON_DRA_NATS_TLS_CA"]),
        ("neuron_dra_audit", {"NEURON_DRA_NATS_TOKEN_FILE": "token"}, ["NEURON_DRA_NATS_TLS_CA"]),
        ("neuron_dra_audit", {"NEURON_DRA_NATS_TLS_CA": "ca.crt"}, ["NEURON_DRA_NATS_TOKEN_FILE"]),
        (
            "neuron_dra_bus_auth",
            {"NEURON_DRA_NATS_TLS_CA": "ca.crt"},
            ["NEURON_DRA_NATS_PASSWORD_FILE"],
        ),
    ],
    ids=["audit-nothing", "audit-no-ca", "audit-no-token", "callout-no-password"],
)
def test_a_service_without_bus_credentials_refuses_to_start(
    nats_server: NatsServer,
    tmp_path: Path,
    module: str,
    given: dict[str, str],
    named: list[str],
) -> None:
    done = _run(module, {"NEURON_DRA_NATS_SERVERS": nats_server.url, **given}, tmp_path)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    message = json.loads(line)["message"]
    assert message.startswith("cannot start: "), message
    for variable in named:
        assert variable in message
    # The lacking settings only, and the way out for debugging.
    assert ("NEURON_DRA_NATS_TLS_CA" in message) == ("NEURON_DRA_NATS_TLS_CA" in named)
    assert "NEURON_DRA_INSECURE_BUS=1" in message
    # It never reached the server.
    assert _connections(nats_server) == 0
    assert not (tmp_path / "audit.jsonl").exists()


def test_the_insecure_mode_connects_and_says_the_bus_is_open(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    port = free_port()
    log = tmp_path / "audit.log"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NEURON_DRA_")}
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "neuron_dra_audit"],
            env={
                **clean,
                **nats_server.open_env,
                "NEURON_DRA_HTTP_PORT": str(port),
                "NEURON_DRA_AUDIT_FILE": str(tmp_path / "audit.jsonl"),
            },
            stderr=err,
            stdout=subprocess.DEVNULL,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        assert _connections(nats_server) >= 1
    finally:
        proc.terminate()
        proc.wait(20)
    first = json.loads(log.read_text().splitlines()[0])
    assert first["level"] == "warning"
    assert first["message"].startswith("INSECURE BUS: NEURON_DRA_INSECURE_BUS is set")
    assert "without NEURON_DRA_NATS_TOKEN_FILE and NEURON_DRA_NATS_TLS_CA" in first["message"]
