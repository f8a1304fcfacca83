"""The README's first command on a machine that has python3 and Go and nothing else.

A copy of the checkout (what a clone holds) is set up by ``make up`` with a PATH of the base
system only: Debian's python3 (externally managed, PEP 668) and no pip, no uv, no kubectl,
no nats-server; and an empty HOME, so no cache of uv or of Python packages. Only the
Kubernetes builds are shared (``NEURON_DRA_CACHE_DIR``), as building them is tested apart.
Then ``make status`` and ``make down`` work the same way.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from neuron_dra_cli import paths

from tests.fixtures.stack import REPO, TEST_FLEET

pytestmark = [pytest.mark.stack, pytest.mark.timeout(1200)]

#: Tools a fresh machine does not have: whatever installs or runs Python packages, and the
#: programs the product brings itself.
NOT_ON_A_FRESH_MACHINE = re.compile(r"^(pip.*|uv|uvx|kubectl|nats-server|python(?!3(\.\d+)?$).*)$")
SYSTEM_PYTHON = Path("/usr/bin/python3")
#: The folder of the go command (its GOROOT's bin, so nothing else comes with it).
GO_BIN = Path(shutil.which("go") or "/usr/local/go/bin/go").resolve().parent


def base_system_bin(into: Path) -> Path:
    """A folder of links to the base system's programs, without the tools above."""
    into.mkdir()
    for folder in (Path("/usr/bin"), Path("/bin")):
        for entry in folder.iterdir():
            if NOT_ON_A_FRESH_MACHINE.match(entry.name) or (into / entry.name).exists():
                continue
            (into / entry.name).symlink_to(entry)
    return into


def copy_of_checkout(into: Path) -> Path:
    """The files a clone would hold (tracked, plus new ones git does not ignore)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        check=True,
        capture_output=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return into


@pytest.mark.skipif(
    not SYSTEM_PYTHON.is_file() or not (GO_BIN / "go").is_file(),
    reason="needs the system python3 and Go of these machines",
)
def test_make_up_status_down_with_only_python3_and_go(tmp_path: Path) -> None:
    checkout = copy_of_checkout(tmp_path / "neuron-dra")
    home = tmp_path / "home"
    home.mkdir()
    bin_dir = base_system_bin(tmp_path / "bin")
    assert not (bin_dir / "pip3").exists()
    assert not (bin_dir / "uv").exists()
    # As `env -i` leaves it: no LANG, TERM, USER or PYTHONUNBUFFERED.
    env = {
        "HOME": str(home),
        "PATH": f"{bin_dir}:{GO_BIN}",
        paths.CACHE_DIR_ENV: str(paths.cache_dir()),
        # The machine's certificate settings, which any program on it uses.
        **{k: v for k, v in os.environ.items() if k in ("SSL_CERT_FILE", "SSL_CERT_DIR")},
    }
    state = tmp_path / "state"
    up_args = f"--detach --state-dir {state} --fleet {TEST_FLEET}"

    def make(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["make", *args],
            cwd=checkout,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    up = make("up", f"ARGS={up_args}", timeout=1000)
    try:
        assert up.returncode == 0, f"make up failed:\n{up.stdout[-4000:]}\n{up.stderr[-4000:]}"
        assert "downloading uv-" in up.stderr, "uv came from somewhere other than its wheel"
        # The workspace's own tools, in the checkout's virtual environment.
        assert (checkout / ".venv" / "bin" / "kubectl").is_file()

        status = make("status", f"ARGS=--state-dir {state}", timeout=120)
        assert status.returncode == 0, f"{status.stdout}\n{status.stderr}"
        assert "kube-apiserver" in status.stdout
        assert "DOWN" not in status.stdout
    finally:
        down = make("down", f"ARGS=--state-dir {state}", timeout=180)
    assert down.returncode == 0, f"{down.stdout}\n{down.stderr}"
    assert "stopped" in down.stdout
