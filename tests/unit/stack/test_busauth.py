"""What ``dev up`` prepares before NATS starts: the component's own callout config, which
the pinned nats-server accepts with the stack's keys; keys kept across restarts; and with
``--insecure-bus`` NATS started without it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from neuron_dra_cli.stack import accounts, busauth
from neuron_dra_cli.stack import components as comp
from neuron_dra_cli.stack.layout import Layout

from tests.unit.deploy.test_kustomize import by_kind, render


def test_nats_accepts_the_callout_config_the_stack_prepares(tmp_path: Path) -> None:
    files = busauth.prepare(Layout(tmp_path))
    assert files.config.read_text() == (busauth.COMPONENT / "auth.conf").read_text()
    nats = comp.nats(
        state_dir=tmp_path, port=4222, monitor_port=8222, config=files.config, env=files.nats_env()
    )
    assert nats.argv[-2:] == ["--config", str(files.config)]
    proc = subprocess.run(
        [*nats.argv, "-t"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **nats.env},
    )
    assert proc.returncode == 0, proc.stderr
    assert "is valid" in proc.stderr + proc.stdout
    # A restarted stack keeps its issuer: clients admitted before are admitted again.
    assert busauth.prepare(Layout(tmp_path)).nats_env() == files.nats_env()


def test_the_stack_applies_the_components_accounts() -> None:
    docs = render(accounts.BASE)
    found = by_kind(docs, "ServiceAccount")
    assert {busauth.ADMIN, busauth.CALLOUT_ACCOUNT, "neuron-dra-discovery"} <= set(found)


def test_an_open_bus_runs_nats_without_the_callout(tmp_path: Path) -> None:
    nats = comp.nats(state_dir=tmp_path, port=4222, monitor_port=8222)
    assert "--config" not in nats.argv
    assert nats.env == {}
