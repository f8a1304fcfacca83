"""Settings come from flags, then the environment, then defaults; errors name the variable."""

from __future__ import annotations

from typing import Annotated

import msgspec
import pytest
from neuron_dra_common.settings import ServiceSettings, SettingsError, load


class PluginSettings(ServiceSettings, frozen=True, kw_only=True):
    node_name: Annotated[str, msgspec.Meta(min_length=1, description="This node")]
    cdi_root: str = "/var/run/cdi"
    health_probe: bool = True
    max_claims: Annotated[int, msgspec.Meta(ge=1)] = 64


def test_defaults_env_and_flags_in_that_order() -> None:
    s = load(
        PluginSettings,
        argv=["--max-claims", "8"],
        environ={"NEURON_DRA_NODE_NAME": "ip-1", "NEURON_DRA_MAX_CLAIMS": "4"},
    )
    assert (s.node_name, s.max_claims, s.cdi_root, s.http_port) == ("ip-1", 8, "/var/run/cdi", 8080)


def test_lists_and_booleans_parse_from_text() -> None:
    s = load(
        PluginSettings,
        environ={
            "NEURON_DRA_NODE_NAME": "ip-1",
            "NEURON_DRA_NATS_SERVERS": "nats://a:4222, nats://b:4222",
            "NEURON_DRA_HEALTH_PROBE": "off",
        },
    )
    assert s.nats_servers == ("nats://a:4222", "nats://b:4222")
    assert s.health_probe is False


@pytest.mark.parametrize(
    ("environ", "argv", "message"),
    [
        (
            {"NEURON_DRA_HTTP_PORT": "http"},
            [],
            "NEURON_DRA_HTTP_PORT='http': expected an integer between 0 and 65535",
        ),
        (
            {"NEURON_DRA_HTTP_PORT": "70000"},
            [],
            "NEURON_DRA_HTTP_PORT='70000': expected an integer between 0 and 65535",
        ),
        ({}, ["--max-claims", "0"], "--max-claims='0': expected an integer of at least 1"),
        (
            {"NEURON_DRA_LOG_LEVEL": "loud"},
            [],
            "NEURON_DRA_LOG_LEVEL='loud': expected one of debug, error, info, warning",
        ),
        (
            {"NEURON_DRA_HEALTH_PROBE": "maybe"},
            [],
            "NEURON_DRA_HEALTH_PROBE='maybe': expected true or false",
        ),
        (
            {"NEURON_DRA_NATS_SERVERS": " , "},
            [],
            "NEURON_DRA_NATS_SERVERS=' , ': expected a comma-separated list of strings, at least 1",
        ),
    ],
)
def test_bad_values_name_the_variable_and_the_expectation(
    environ: dict[str, str], argv: list[str], message: str
) -> None:
    with pytest.raises(SettingsError) as caught:
        load(PluginSettings, argv=argv, environ={"NEURON_DRA_NODE_NAME": "ip-1", **environ})
    assert str(caught.value) == message


def test_missing_required_setting_names_variable_and_flag() -> None:
    with pytest.raises(SettingsError) as caught:
        load(PluginSettings, environ={})
    assert str(caught.value) == (
        "NEURON_DRA_NODE_NAME (or --node-name) is required: expected a non-empty string"
    )


def test_help_lists_every_flag_with_its_env_twin(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        load(PluginSettings, argv=["--help"], environ={})
    out = capsys.readouterr().out
    for flag, env in [("--node-name", "NEURON_DRA_NODE_NAME"), ("--http-port", "")]:
        assert flag in out
        assert env in out
