"""The Kubernetes binaries built from the official Go modules (tools/kube)."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
from neuron_dra_cli import kubebuild
from neuron_dra_cli.paths import CACHE_DIR_ENV

# A cold build compiles the control plane and the kubelet: about 10 minutes on 2 cores.
BUILD_TIMEOUT = 3600


def _version_of(binary: Path) -> str:
    out = subprocess.run(
        [str(binary), "--version"], capture_output=True, text=True, timeout=60, check=True
    )
    return out.stdout.strip()


def _check_release(bins: kubebuild.KubeBinaries, version: str) -> None:
    assert bins.version == version
    for binary in (bins.kube_apiserver, bins.kube_controller_manager, bins.kube_scheduler):
        assert _version_of(binary) == f"Kubernetes v{version}", binary
    assert _version_of(bins.hollow_node) == f"Kubernetes v{version}"
    etcd = kubebuild.SUPPORTED[version].etcd_version
    assert f"etcd Version: {etcd}" in _version_of(bins.etcd)
    help_text = subprocess.run(
        [str(bins.dra_test_driver), "kubelet-plugin", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    for flag in ("--node-name", "--datadir", "--plugin-registration-path", "--cdi-dir"):
        assert flag in help_text.stdout + help_text.stderr


@pytest.mark.timeout(BUILD_TIMEOUT)
def test_default_release_builds_with_the_pinned_version() -> None:
    bins = kubebuild.ensure_binaries(progress=lambda _m: None)
    assert bins.kube_apiserver.parent == kubebuild.bin_dir(kubebuild.DEFAULT_VERSION)
    _check_release(bins, kubebuild.DEFAULT_VERSION)


@pytest.mark.timeout(BUILD_TIMEOUT)
def test_second_call_is_a_cache_hit_that_does_not_run_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = kubebuild.ensure_binaries(progress=lambda _m: None)

    def no_go(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("go was invoked on a cache hit")

    monkeypatch.setattr(subprocess, "run", no_go)
    monkeypatch.setattr(shutil, "which", no_go)
    messages: list[str] = []
    t0 = time.monotonic()
    second = kubebuild.ensure_binaries(kubebuild.DEFAULT_VERSION, progress=messages.append)
    assert time.monotonic() - t0 < 1.0
    assert second == first
    assert messages == []


def test_unknown_version_is_refused_with_the_supported_ones() -> None:
    with pytest.raises(kubebuild.KubeBuildError) as info:
        kubebuild.ensure_binaries("1.29.0", progress=lambda _m: None)
    message = str(info.value)
    assert "'1.29.0' is not supported" in message
    for version in kubebuild.SUPPORTED:
        assert version in message


def test_missing_go_fails_clearly(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(kubebuild.KubeBuildError, match="`go` is not on PATH"):
        kubebuild.ensure_binaries(progress=lambda _m: None)


def test_minor_and_v_prefixed_versions_resolve() -> None:
    assert kubebuild.resolve_version("v1.36.3").version == "1.36.3"
    assert kubebuild.resolve_version("1.34").version == kubebuild.FLOOR_VERSION


@pytest.mark.floor
@pytest.mark.timeout(BUILD_TIMEOUT)
def test_floor_release_builds_with_the_pinned_version() -> None:
    bins = kubebuild.ensure_binaries(kubebuild.FLOOR_VERSION, progress=lambda _m: None)
    assert bins.kube_apiserver.parent == kubebuild.bin_dir(kubebuild.FLOOR_VERSION)
    _check_release(bins, kubebuild.FLOOR_VERSION)
