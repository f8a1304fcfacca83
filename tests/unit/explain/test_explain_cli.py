"""What ``neuron-dra explain`` makes of its arguments before it reads the cluster."""

from pathlib import Path

import pytest
from neuron_dra_cli.errors import CliError
from neuron_dra_cli.explain_cmd import context_namespace, parse_target
from neuron_dra_common.explain import Snapshot


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


def test_a_snapshot_shows_itself_as_counts() -> None:
    """What explain read is shown by its counts: a 1,000-node cluster's full repr is tens of
    megabytes of text that logs and asyncio would otherwise build."""
    slices = [{"spec": {"devices": [{"name": f"neurondevice{i}"} for i in range(16)]}}] * 1000
    snap = Snapshot.build(nodes=[{}] * 1000, slices=slices, server_version="v1.36.3")
    assert repr(snap) == (
        "Snapshot(pods=0, nodes=1000, slices=1000, claims=0, classes=0, templates=0, "
        "server_version='v1.36.3')"
    )
