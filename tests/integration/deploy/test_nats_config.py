"""The NATS configuration each overlay installs is one the pinned nats-server accepts."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from neuron_dra_bus_auth import keys
from neuron_dra_cli.stack.pki import Pki

from tests.fixtures.nats import nats_binary
from tests.unit.deploy.test_bus_auth_component import with_bus_auth
from tests.unit.deploy.test_kustomize import KUSTOMIZE, by_kind, render


def _secret_files(pod: dict[str, Any], container: dict[str, Any], folder: Path) -> dict[str, str]:
    """The files the StatefulSet mounts from Secrets, made here (NATS's certificate and key
    from a CA of the test's own; made once per folder): each mount path, and the folder that
    stands for it."""
    cert = Pki(folder / "pki").nats()
    made = {"tls.crt": cert.cert.read_bytes(), "tls.key": cert.key.read_bytes()}
    volumes = {v["name"]: v for v in pod.get("volumes", ())}
    moved: dict[str, str] = {}
    for mount in container.get("volumeMounts", ()):
        secret = volumes.get(mount["name"], {}).get("secret")
        if secret is None:
            continue
        there = folder / mount["name"]
        there.mkdir(exist_ok=True)
        for item in secret["items"]:
            (there / item["path"]).write_bytes(made[item["key"]])
        moved[mount["mountPath"]] = str(there)
    return moved


def _check(
    docs: list[dict[str, Any]], folder: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """``nats-server -t`` on the rendered config files, as the StatefulSet starts it, with the
    files it mounts from Secrets where the config names them."""
    [config] = [c for n, c in by_kind(docs, "ConfigMap").items() if n.startswith("nats-config")]
    pod = by_kind(docs, "StatefulSet")["nats"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    moved = _secret_files(pod, container, folder)
    for name, text in config["data"].items():
        for mount_path, there in moved.items():
            text = text.replace(f"{mount_path}/", f"{there}/")
        (folder / name).write_text(text)
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
