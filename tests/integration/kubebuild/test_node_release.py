"""A kubelet release kept only as a simulated node (kubebuild.NODE_RELEASES): built alone, from
the official k8s.io/kubernetes module of that release, and reporting that release."""

from __future__ import annotations

import subprocess
import time

import pytest
from neuron_dra_cli import kubebuild, paths

# A first build compiles the kubelet code of that release: about 4 minutes on 2 cores once the
# floor release has filled Go's build cache.
BUILD_TIMEOUT = 3600


@pytest.mark.floor
@pytest.mark.timeout(BUILD_TIMEOUT)
def test_the_1_34_1_node_is_built_alone_and_reports_its_release() -> None:
    binary = kubebuild.ensure_node_binary("v1.34.1", progress=lambda _m: None)
    assert binary == paths.cache_dir() / "kube" / "1.34.1" / "bin" / "hollow-node"
    out = subprocess.run(
        [str(binary), "--version"], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "Kubernetes v1.34.1"
    assert sorted(p.name for p in binary.parent.iterdir()) == ["hollow-node"]
    t0 = time.monotonic()
    messages: list[str] = []
    assert kubebuild.ensure_node_binary("1.34.1", progress=messages.append) == binary
    assert time.monotonic() - t0 < 5.0
    assert messages == []  # a cache hit says nothing


def test_an_unknown_node_release_is_refused_with_the_supported_ones() -> None:
    with pytest.raises(kubebuild.KubeBuildError) as info:
        kubebuild.ensure_node_binary("1.34.3", progress=lambda _m: None)
    message = str(info.value)
    assert "no simulated node of Kubernetes '1.34.3'" in message
    assert "1.36.3, 1.34.4, 1.34.1" in message
