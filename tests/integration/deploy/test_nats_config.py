"""The NATS configuration each overlay installs is one the pinned nats-server accepts."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from neuron_dra_bus_auth import keys

from tests.fixtures.nats import nats_binary
from tests.unit.deploy.test_bus_auth_component import with_bus_auth
from tests.unit.deploy.test_kustomize import KUSTOMIZE, by_kind, render


def _check(
    docs: list[dict[str, Any]], folder: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """``nats-server -t`` on the rendered config files, as the StatefulSet starts it."""
    [config] = [c for n, c in by_kind(docs, "ConfigMap").items() if n.startswith("nats-config")]
    for name, text in config["data"].items():
        (folder / name).write_text(text)
    [container] = by_kind(docs, "StatefulSet")["nats"]["spec"]["template"]["spec"]["containers"]
    assert container["args"][0] == "--config"
    assert container["args"][1].startswith("/etc/nats/")
    assert {e["name"] for e in container["env"]} == {"POD_NAME", *env}
    return subprocess.run(
        [str(nats_binary()), "-c", str(folder / Path(container["args"][1]).name), "-t"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "POD_NAME": "nats-0", **env},
    )


@pytest.mark.parametrize("tree", ["base", "overlays/eks", "overlays/local"])
def test_nats_server_accepts_the_rendered_configuration(tree: str, tmp_path: Path) -> None:
    proc = _check(render(KUSTOMIZE / tree), tmp_path, {})
    assert proc.returncode == 0, proc.stderr
    assert "is valid" in proc.stderr + proc.stdout


@pytest.mark.parametrize("tree", ["base", "overlays/eks"])
def test_nats_server_accepts_the_auth_callout_with_the_secrets_keys(
    tree: str, tmp_path: Path
) -> None:
    (tmp_path / "overlay").mkdir()
    docs = with_bus_auth(tmp_path / "overlay", tree)
    made = keys.new_keys()
    env = {
        "NEURON_DRA_BUS_AUTH_ISSUER": made.public_key,
        "NEURON_DRA_BUS_AUTH_PASSWORD": made.password,
    }
    proc = _check(docs, tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    assert "is valid" in proc.stderr + proc.stdout
    # The server checks the issuer: a Secret with a wrong key stops it, naming the field.
    proc = _check(docs, tmp_path, {**env, "NEURON_DRA_BUS_AUTH_ISSUER": made.seed})
    assert proc.returncode != 0
    assert "public account nkey" in proc.stderr
