"""The pinned Kubernetes sources the wire checks compare with, from Go's module cache."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from neuron_dra_cli.kubebuild import KubeBuildError, kube_module_dir


@pytest.fixture(scope="session")
def kube_module() -> Callable[[str], Path]:
    """``kube_module("k8s.io/api")``: that module's sources at the pinned release.

    A missing module fails the test (never skips it): the test command builds the pinned
    release first, which fetches every module these checks read.
    """

    def find(module: str) -> Path:
        try:
            return kube_module_dir(module)
        except KubeBuildError as exc:
            pytest.fail(f"the wire check cannot run: {exc}", pytrace=False)

    return find
