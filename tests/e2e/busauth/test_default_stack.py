"""``neuron-dra dev up`` without flags: every service authenticated over TLS, an anonymous
client turned away, and ``dev status`` saying so."""

from __future__ import annotations

import json
import ssl

import pytest
from neuron_dra_cli.stack import busauth

from tests.fixtures.natsclients import refused
from tests.fixtures.stack import KubeStack, neuron_dra

pytestmark = pytest.mark.stack


def test_every_service_of_the_default_stack_connects_with_its_own_token(
    bus_auth_stack: KubeStack,
) -> None:
    components = json.loads((bus_auth_stack.state_dir / "state.json").read_text())["components"]
    on_bus = [c for c in components if "NEURON_DRA_NATS_SERVERS" in c["env"]]
    assert {c["kind"] for c in on_bus} >= {"discovery", "kubelet-plugin", "audit", "alerts"}
    for c in on_bus:
        assert "NEURON_DRA_INSECURE_BUS" not in c["env"], c["name"]
        assert c["env"].get("NEURON_DRA_NATS_TLS_CA"), c["name"]
        if c["kind"] != busauth.KIND:
            assert c["env"].get("NEURON_DRA_NATS_TOKEN_FILE"), c["name"]
    status = neuron_dra("dev", "status", "--state-dir", str(bus_auth_stack.state_dir))
    assert status.returncode == 0, status.stderr
    assert "bus auth     every client needs a token" in status.stdout


async def test_an_anonymous_client_is_refused_by_the_default_stack(
    bus_auth_stack: KubeStack,
) -> None:
    stack = bus_auth_stack
    files = busauth.BusAuth(stack.state_dir / "bus-auth")
    # It trusts the right CA and speaks TLS; it only has no token.
    why = await refused(
        stack.nats_url, token=None, tls=ssl.create_default_context(cafile=str(files.tls_ca))
    )
    assert "authorization" in why, why
    # The server says so in its log too.
    log = (stack.state_dir / "logs" / "nats.log").read_text(errors="replace")
    assert "authentication error" in log
