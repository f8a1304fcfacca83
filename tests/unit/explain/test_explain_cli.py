"""What ``neuron-dra explain`` makes of its arguments before it reads the cluster."""

from pathlib import Path

import pytest
from neuron_dra_cli.errors import CliError
from neuron_dra_cli.explain_cmd import context_namespace, parse_target


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("pod/train-0", ("Pod", "train-0")),
        ("po/train-0", ("Pod", "train-0")),
        ("train-0", ("Pod", "train-0")),
        ("pods.v1/train-0", ("Pod", "train-0")),
        ("resourceclaim/shared", ("ResourceClaim", "shared")),
        ("rc/shared", ("ResourceClaim", "shared")),
        ("nusw/train", ("NeuronUltraServerWorkload", "train")),
        ("neuronultraserverworkload/train", ("NeuronUltraServerWorkload", "train")),
    ],
)
def test_targets_as_kubectl_writes_them(text: str, expected: tuple[str, str]) -> None:
    assert parse_target(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [("deployment/x", "unknown kind 'deployment'"), ("pod/", "the name after pod/ is empty")],
)
def test_bad_targets_name_the_problem(text: str, message: str) -> None:
    with pytest.raises(CliError, match=message):
        parse_target(text)


def test_default_namespace_is_the_contexts(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(
        "current-context: a\n"
        "contexts:\n"
        "- name: a\n  context: {cluster: c, user: u, namespace: ml}\n"
        "- name: b\n  context: {cluster: c, user: u}\n"
    )
    assert context_namespace(str(config), None) == "ml"
    assert context_namespace(str(config), "b") == "default"
