"""The device plugin's command line: --help with every variable, a bad setting named."""

from __future__ import annotations

import pytest
from neuron_dra_device_plugin.main import main


def test_help_lists_the_kubelet_root_and_resources_with_their_variables(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    out = " ".join(text.split())
    for flag, env in (
        ("--kubelet-root", "NEURON_DRA_KUBELET_ROOT"),
        ("--resources", "NEURON_DRA_RESOURCES"),
        ("--health-interval", "NEURON_DRA_HEALTH_INTERVAL"),
        ("--honour-annotations", "NEURON_DRA_HONOUR_ANNOTATIONS"),
    ):
        assert flag in out
        assert env in out
    # argparse wraps the default in the middle of a name.
    defaults = "aws.amazon.com/neuron,aws.amazon.com/neurondevice,aws.amazon.com/neuroncore"
    assert defaults in "".join(text.split())


def test_a_resource_the_plugin_does_not_serve_is_refused_by_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["--node-name", "n1", "--resources", "aws.amazon.com/neuron,nvidia.com/gpu"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("neuron-dra-device-plugin: ")
    assert "'nvidia.com/gpu' is not one of aws.amazon.com/neuron" in err


def test_a_node_without_neuron_hardware_stops_with_the_node_named(
    capsys: pytest.CaptureFixture[str], tmp_path: object
) -> None:
    code = main(["--node-name", "n1", "--host-root", str(tmp_path), "--neuron-ls-command", "false"])
    assert code == 1
    assert capsys.readouterr().err.startswith("neuron-dra-device-plugin: node n1: ")
