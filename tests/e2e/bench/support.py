"""Running ``python -m bench`` from the command line, as a user does."""

from __future__ import annotations

import subprocess
import sys

from tests.fixtures.stack import REPO


def run_bench(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python -m bench ARGS`` from the repository's root; it must succeed (the tail of its
    output is the failure's message)."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc
