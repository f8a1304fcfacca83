"""Coverage-guided fuzzing (atheris) of the decoders that take outside input: every bus
consumer's ``admit`` and the kubelet plugin's opaque configs, 20,000 inputs each.

Each run is its own process (libFuzzer exits when done) with a fixed seed, so a failure
replays with the same command; the input that crashed is kept in the test's folder.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.stack import REPO

RUNS = 20_000


@pytest.mark.parametrize("target", ["intake", "opaque"])
def test_no_input_crashes_the_decoder(target: str, tmp_path: Path) -> None:
    command = [
        sys.executable, "-m", "tests.contracts.atheris_targets", target,
        f"-runs={RUNS}", "-seed=20261126", f"-artifact_prefix={tmp_path}/",
    ]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    crashes = sorted(p.name for p in tmp_path.iterdir())
    assert proc.returncode == 0, (
        f"`{' '.join(command[1:])}` exited {proc.returncode}, inputs kept: {crashes}\n"
        f"{proc.stderr[-4000:]}"
    )
    assert f"Done {RUNS} runs" in proc.stderr
    assert crashes == []
