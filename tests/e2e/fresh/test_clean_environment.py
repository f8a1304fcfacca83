"""The test command's own checks in the environment `env -i` leaves: HOME, a PATH of Go and
the base system (no /usr/sbin, /usr/local/bin or the virtual environment), the machine's
certificate bundle, and nothing else (no PYTHONUNBUFFERED, LANG, TERM or USER).

The checkout's tests that depend on their environment run there: stdout reaches a pipe line
by line (a foreground `dev up` read by CI), Go's module cache is found from `go env`, and
tools in /usr/sbin are found without it on PATH.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.e2e.fresh.test_fresh_machine import GO_BIN
from tests.fixtures.stack import REPO

pytestmark = [pytest.mark.stack, pytest.mark.timeout(900)]

#: What depends on the environment, from the unit tests up to a stack in the foreground.
SELECTED = (
    "tests/unit/cli/test_line_buffered.py",
    "tests/unit/cli/test_kube_modules.py",
    "tests/unit/cli/test_imagebuild.py",
    "tests/unit/protos",
    "tests/e2e/stack/test_dev_commands.py::test_foreground_up_stops_everything_on_a_signal",
)


def clean_environment() -> dict[str, str]:
    """What `env -i HOME=$HOME PATH=<go>:/usr/bin:/bin SSL_CERT_FILE=...` passes on."""
    env = {"HOME": os.environ["HOME"], "PATH": f"{GO_BIN}:/usr/bin:/bin"}
    for name in ("SSL_CERT_FILE", "SSL_CERT_DIR"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def test_the_checks_that_depend_on_the_environment_pass_in_a_clean_one(tmp_path: Path) -> None:
    env = clean_environment()
    assert not {"PYTHONUNBUFFERED", "LANG", "TERM", "USER"} & set(env)
    command = (
        "source scripts/bootstrap.sh >/dev/null && "
        f"pytest -p no:cacheprovider --basetemp={tmp_path / 'basetemp'} -q " + " ".join(SELECTED)
    )
    proc = subprocess.run(
        ["/bin/bash", "-c", command],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=850,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    summary = proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, summary
    assert " passed" in proc.stdout, summary
    assert " skipped" not in proc.stdout, summary
