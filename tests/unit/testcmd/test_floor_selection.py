"""The test command builds Kubernetes 1.34 only when a selected test runs on it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.stack import REPO


@pytest.mark.parametrize(
    ("selection", "needed"),
    [
        ((), "yes"),
        (("-m", "not floor"), "no"),
        (("tests/unit/cli",), "no"),
        (("tests/e2e/floor",), "yes"),
        (("tests/e2e/stack/test_kubelet_dra_path.py",), "no"),
    ],
)
def test_floor_is_needed_only_by_a_selection_with_floor_tests(
    tmp_path: Path, selection: tuple[str, ...], needed: str
) -> None:
    out = tmp_path / "floor"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            *selection,
            f"--floor-needed-file={out}",
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    assert out.read_text().strip() == needed
