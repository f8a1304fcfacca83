"""The Kubernetes modules' sources are found where Go keeps them, wherever that is."""

from __future__ import annotations

from pathlib import Path

import pytest
from neuron_dra_cli.kubebuild import KubeBuildError, kube_module_dir


def test_a_module_is_found_in_the_cache_go_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "k8s.io" / "api@v0.36.3").mkdir(parents=True)
    monkeypatch.setenv("GOMODCACHE", str(tmp_path))
    assert kube_module_dir("k8s.io/api", "1.36.3") == tmp_path / "k8s.io" / "api@v0.36.3"


def test_a_missing_module_says_where_it_looked_and_what_puts_it_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GOMODCACHE", str(tmp_path))
    with pytest.raises(KubeBuildError) as err:
        kube_module_dir("k8s.io/kubelet", "1.34")
    assert str(err.value) == (
        f"k8s.io/kubelet@v0.34.4 is not in Go's module cache ({tmp_path}, from `go env "
        "GOMODCACHE`); building the Kubernetes 1.34.4 binaries puts it there: "
        "`neuron-dra dev build --k8s-version 1.34.4`"
    )
