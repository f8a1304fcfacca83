"""``python -m bench``: the scenarios it offers and how it refuses a wrong name, without running one."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench.__main__ import SCENARIOS, main
from tests.fixtures.stack import REPO


def test_help_lists_every_scenario_and_quick(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "{" + ",".join(sorted(SCENARIOS)) + "}" in out
    assert {"allocator", "scale", "slices", "explain"} <= set(SCENARIOS)
    assert "--quick" in out


def test_an_unknown_scenario_is_refused_naming_the_choices(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["recover"])
    assert exited.value.code == 2
    assert "invalid choice: 'recover'" in capsys.readouterr().err


def test_recovery_help_from_the_command_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "recovery", "--help"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "usage: python -m bench" in proc.stdout


def test_publisher_replicas_is_refused_outside_scale_and_beyond_two(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["slices", "--publisher-replicas", "2"])
    assert exited.value.code == 2
    assert "--publisher-replicas: only the scale scenario takes it, not slices" in (
        capsys.readouterr().err
    )
    with pytest.raises(SystemExit) as exited:
        main(["scale", "--publisher-replicas", "3"])
    assert exited.value.code == 2
    assert "invalid choice: 3" in capsys.readouterr().err
