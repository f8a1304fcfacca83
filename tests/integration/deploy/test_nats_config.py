"""The NATS configuration each overlay installs is one the pinned nats-server accepts."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.fixtures.nats import nats_binary
from tests.unit.deploy.test_kustomize import KUSTOMIZE, by_kind, render


@pytest.mark.parametrize("tree", ["base", "overlays/eks", "overlays/local"])
def test_nats_server_accepts_the_rendered_configuration(tree: str, tmp_path: Path) -> None:
    docs = render(KUSTOMIZE / tree)
    [config] = [c for n, c in by_kind(docs, "ConfigMap").items() if n.startswith("nats-config")]
    conf = tmp_path / "nats.conf"
    conf.write_text(config["data"]["nats.conf"])
    # The pod's environment, as the StatefulSet sets it.
    [container] = by_kind(docs, "StatefulSet")["nats"]["spec"]["template"]["spec"]["containers"]
    assert {e["name"] for e in container["env"]} == {"POD_NAME"}
    assert container["args"] == ["--config", "/etc/nats/nats.conf"]
    proc = subprocess.run(
        [str(nats_binary()), "-c", str(conf), "-t"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "POD_NAME": "nats-0"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "is valid" in proc.stderr + proc.stdout
