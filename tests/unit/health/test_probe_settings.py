"""The probe's command line: a bad setting stops it at once, naming the variable."""

from __future__ import annotations

import pytest
from neuron_dra_health_monitor.probe_main import main


def test_a_bad_setting_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NEURON_DRA_NODE_NAME", "n1")
    monkeypatch.setenv("NEURON_DRA_POLL_SECONDS", "0")
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("neuron-dra-health-probe: NEURON_DRA_POLL_SECONDS='0'")


def test_the_node_name_is_required(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("NEURON_DRA_NODE_NAME", raising=False)
    assert main([]) == 2
    assert "NEURON_DRA_NODE_NAME" in capsys.readouterr().err
