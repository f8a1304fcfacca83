"""The local stack for a benchmark: ``neuron-dra dev up --detach`` with a fleet file of the
scenario's own, and always ``dev down`` afterwards, even on Ctrl-C or SIGTERM."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

__all__ = ["REPO", "cli", "local_stack"]

REPO = Path(__file__).resolve().parents[1]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """Run this checkout's ``neuron-dra`` command, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "neuron_dra_cli", *args],
        capture_output=True,
        text=True,
        # A first `dev up` builds the Kubernetes binaries (and waits for a build in progress).
        timeout=3600,
        cwd=REPO,
        env=os.environ.copy(),
    )


@contextlib.contextmanager
def local_stack(tmp: Path, *, fleet: str) -> Iterator[dict[str, Any]]:
    """``dev up`` with the fleet file text ``fleet`` under ``tmp``; yields ``state.json``."""
    fleet_file = tmp / "fleet.yaml"
    fleet_file.write_text(fleet)
    state = tmp / "stack"

    def interrupted(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupted)
    try:
        up = cli("dev", "up", "--detach", "--state-dir", str(state), "--fleet", str(fleet_file))
        if up.returncode != 0:
            raise RuntimeError(f"dev up failed:\n{up.stdout}\n{up.stderr}")
        recorded: dict[str, Any] = json.loads((state / "state.json").read_text())
        recorded["state_dir"] = str(state)
        try:
            yield recorded
        except BaseException:
            _keep_logs(state)
            raise
    finally:
        # A second Ctrl-C must not cut the tear-down short and leave the stack running.
        old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            down = cli("dev", "down", "--state-dir", str(state))
            if down.returncode != 0:
                print(f"dev down failed:\n{down.stdout}\n{down.stderr}", file=sys.stderr)
        finally:
            signal.signal(signal.SIGINT, old_int)
            signal.signal(signal.SIGTERM, previous)


def _keep_logs(state: Path) -> None:
    """Copy the failed run's component logs out of its temporary directory, and say where."""
    logs = state / "logs"
    if not logs.is_dir():
        return
    kept = Path(tempfile.mkdtemp(prefix="bench-logs-"))
    shutil.copytree(logs, kept, dirs_exist_ok=True)
    print(f"the stack's logs are kept in {kept}", file=sys.stderr)
