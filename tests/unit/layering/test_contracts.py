"""The layering contracts in pyproject.toml hold, and a forbidden import breaks them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
CONFIG = REPO / "pyproject.toml"
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def contracts() -> list[dict[str, object]]:
    with CONFIG.open("rb") as f:
        found: list[dict[str, object]] = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    return found


def lint(contract: str, *, cwd: Path, pythonpath: Path | None = None) -> tuple[int, str]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    out = subprocess.run(
        [
            str(LINT_IMPORTS),
            *("--config", str(CONFIG), "--contract", contract, "--no-cache", "--no-logo"),
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    # import-linter wraps long lines of its report; join them back for matching.
    return out.returncode, " ".join((out.stdout + out.stderr).split())


def test_every_contract_has_an_id_and_external_packages_are_checked() -> None:
    with CONFIG.open("rb") as f:
        config = tomllib.load(f)["tool"]["importlinter"]
    assert config["include_external_packages"] is True
    ids = [c.get("id") for c in contracts()]
    assert all(ids), ids
    assert len(set(ids)) == len(ids), ids


@pytest.mark.parametrize("contract", [str(c["id"]) for c in contracts()])
def test_contract_is_kept(contract: str) -> None:
    code, report = lint(contract, cwd=REPO)
    assert code == 0, report


def _source_copy(dest: Path) -> Path:
    """A copy of every root package's source, to be put first on the import path."""
    roots = [REPO / "libs" / "common" / "src", REPO / "libs" / "cli" / "src"]
    roots += sorted((REPO / "services").glob("*/src"))
    for root in roots:
        for package in root.glob("neuron_dra_*"):
            shutil.copytree(
                package, dest / package.name, ignore=shutil.ignore_patterns("__pycache__")
            )
    return dest


@pytest.mark.parametrize(
    ("module", "statement", "contract", "reported"),
    [
        (
            "neuron_dra_slice_publisher/slices.py",
            "import nats",
            "nats-in-bus",
            "neuron_dra_slice_publisher.slices -> nats",
        ),
        (
            "neuron_dra_discovery/agent.py",
            "import nats.js",
            "nats-in-bus",
            "neuron_dra_discovery.agent -> nats",
        ),
        (
            "neuron_dra_health_monitor/probe_node.py",
            "import kubernetes_asyncio.client",
            "kube-api-in-kube",
            "neuron_dra_health_monitor.probe_node -> kubernetes_asyncio",
        ),
        (
            "neuron_dra_topology_allocator/main.py",
            "import grpc.aio",
            "grpc-in-servers",
            "neuron_dra_topology_allocator.main -> grpc",
        ),
        (
            "neuron_dra_topology_allocator/placement.py",
            "from neuron_dra_common.bus import Publisher",
            "pure-modules",
            "neuron_dra_topology_allocator.placement is not allowed to import "
            "neuron_dra_common.bus",
        ),
        (
            "neuron_dra_common/cdi.py",
            "import neuron_dra_common.runtime.http",
            "pure-modules",
            "neuron_dra_common.cdi is not allowed to import aiohttp",
        ),
        (
            "neuron_dra_ultraserver_operator/reconciler.py",
            "import aiohttp.web",
            "aiohttp-behind-http",
            "neuron_dra_ultraserver_operator.reconciler -> aiohttp",
        ),
        (
            "neuron_dra_audit/writer.py",
            "from prometheus_client import Counter",
            "metrics-in-telemetry",
            "neuron_dra_audit.writer -> prometheus_client",
        ),
        (
            "neuron_dra_kubelet_plugin/main.py",
            "import neuron_dra_cli.main",
            "services-without-cli",
            "neuron_dra_kubelet_plugin.main -> neuron_dra_cli.main",
        ),
    ],
)
def test_a_forbidden_import_breaks_its_contract(
    tmp_path: Path, module: str, statement: str, contract: str, reported: str
) -> None:
    tree = _source_copy(tmp_path / "src")
    target = tree / module
    target.write_text(target.read_text(encoding="utf-8") + f"\n{statement}\n", encoding="utf-8")
    code, report = lint(contract, cwd=tmp_path, pythonpath=tree)
    assert code != 0, report
    assert "BROKEN" in report, report
    assert reported in report, report
