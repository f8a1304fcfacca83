"""Which settings a service needs on the bus before it may start (the refusal itself is
tested with real processes in tests/integration/runtime/test_bus_credentials.py)."""

from __future__ import annotations

from neuron_dra_bus_auth.settings import BusAuthSettings
from neuron_dra_common.settings import ServiceSettings, load
from neuron_dra_device_plugin.settings import DevicePluginSettings
from neuron_dra_scheduler_extender.settings import ExtenderSettings


def test_a_bus_client_needs_a_token_and_the_servers_ca() -> None:
    refusal = load(ServiceSettings, environ={}).bus_refusal()
    assert refusal.startswith("NEURON_DRA_NATS_TOKEN_FILE and NEURON_DRA_NATS_TLS_CA not set")
    given = {"NEURON_DRA_NATS_TOKEN_FILE": "/t", "NEURON_DRA_NATS_TLS_CA": "/ca"}
    assert load(ServiceSettings, environ=given).bus_refusal() == ""


def test_the_insecure_mode_is_asked_by_name_and_lets_it_start() -> None:
    settings = load(ServiceSettings, environ={"NEURON_DRA_INSECURE_BUS": "1"})
    assert settings.insecure_bus
    assert settings.bus_refusal() == ""
    assert settings.missing_bus_credentials() == [
        "NEURON_DRA_NATS_TOKEN_FILE",
        "NEURON_DRA_NATS_TLS_CA",
    ]
    assert load(ServiceSettings, argv=["--insecure-bus", "true"], environ={}).insecure_bus


def test_the_callout_needs_its_password_and_the_extender_no_bus() -> None:
    callout = load(BusAuthSettings, environ={}).bus_refusal()
    assert callout.startswith("NEURON_DRA_NATS_PASSWORD_FILE and NEURON_DRA_NATS_TLS_CA")
    assert load(ExtenderSettings, environ={}).bus_refusal() == ""


def test_the_device_plugin_needs_the_bus_only_when_it_uses_it() -> None:
    quiet = {
        "NEURON_DRA_NODE_NAME": "n1",
        "NEURON_DRA_HEALTH_EVENTS": "false",
        "NEURON_DRA_HEARTBEATS": "false",
    }
    assert load(DevicePluginSettings, environ=quiet).bus_refusal() == ""
    beating = {**quiet, "NEURON_DRA_HEARTBEATS": "true"}
    assert load(DevicePluginSettings, environ=beating).bus_refusal() != ""
