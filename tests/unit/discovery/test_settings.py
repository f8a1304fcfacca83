"""Discovery's settings: env twins, and errors that name the variable."""

from __future__ import annotations

import pytest
from neuron_dra_common.settings import SettingsError, load
from neuron_dra_discovery.settings import DiscoverySettings


def test_node_name_and_roots_come_from_the_environment() -> None:
    s = load(
        DiscoverySettings,
        argv=[],
        environ={
            "NEURON_DRA_NODE_NAME": "trn2-48xl-0",
            "NEURON_DRA_HOST_ROOT": "/host",
            "NEURON_DRA_NEURON_LS_COMMAND": "/host/bin/neuron-ls,-j",
        },
    )
    assert (s.node_name, s.host_root) == ("trn2-48xl-0", "/host")
    assert s.neuron_ls_command == ("/host/bin/neuron-ls", "-j")


def test_missing_node_name_names_the_variable() -> None:
    with pytest.raises(SettingsError, match="NEURON_DRA_NODE_NAME"):
        load(DiscoverySettings, argv=[], environ={})


def test_bad_heartbeat_names_the_variable() -> None:
    with pytest.raises(SettingsError, match="NEURON_DRA_HEARTBEAT_SECONDS='soon'"):
        load(
            DiscoverySettings,
            argv=[],
            environ={"NEURON_DRA_NODE_NAME": "n", "NEURON_DRA_HEARTBEAT_SECONDS": "soon"},
        )
