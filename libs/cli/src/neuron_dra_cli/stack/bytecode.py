"""Compiled bytecode for the stack's Python services, made once and shared.

The stack starts dozens of Python processes at once (a discovery agent and a kubelet
plugin per node). Without bytecode each of them compiles every module it imports from
source, the same work dozens of times over on a machine's few cores: on a fresh checkout,
or wherever ``PYTHONDONTWRITEBYTECODE`` is set, a plugin spent a minute compiling before
its first log line. Here one process imports every service's modules first and writes
their bytecode into the user's cache (``PYTHONPYCACHEPREFIX``), and every service process
reads it from there.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Final

from neuron_dra_cli import paths

__all__ = ["PACKAGES", "Warmup", "python_env", "start_warmup"]

#: The packages the stack runs as services (and what they share).
PACKAGES: Final = (
    "neuron_dra_common",
    "neuron_dra_discovery",
    "neuron_dra_kubelet_plugin",
    "neuron_dra_slice_publisher",
    "neuron_dra_topology_allocator",
    "neuron_dra_ultraserver_operator",
)

# Imports every module of each package (not ``__main__``), which compiles them and all they
# import; one that cannot be imported here is left to compile where it is used.
_SCRIPT: Final = """
import importlib, pkgutil, sys
for top in sys.argv[1:]:
    try:
        package = importlib.import_module(top)
    except Exception:
        continue
    for info in pkgutil.walk_packages(package.__path__, top + "."):
        if info.name.rsplit(".", 1)[-1] == "__main__":
            continue
        try:
            importlib.import_module(info.name)
        except Exception:
            pass
"""


def pycache_dir() -> Path:
    return paths.cache_dir() / "pycache"


def python_env() -> dict[str, str]:
    """Environment of a Python service: bytecode from (and to) the shared cache.

    An empty ``PYTHONDONTWRITEBYTECODE`` counts as unset: the first process to import a
    module that is not compiled yet writes it there for the others.
    """
    return {"PYTHONPYCACHEPREFIX": str(pycache_dir()), "PYTHONDONTWRITEBYTECODE": ""}


class Warmup:
    """The compiling process, started early so it runs while the control plane starts."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self._proc = proc
        self._t0 = time.monotonic()
        self._seconds: float | None = None

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def wait(self, *, timeout: float = 300.0) -> float:
        """Wait until the bytecode is written; return how long compiling took. A failure
        only costs the services time."""
        try:
            self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._seconds is None:
            self._seconds = time.monotonic() - self._t0
        return self._seconds


def start_warmup(packages: tuple[str, ...] = PACKAGES) -> Warmup:
    """Start compiling the services' modules in the background."""
    import os

    env = {**os.environ, **python_env()}
    proc = subprocess.Popen(
        [sys.executable, "-c", _SCRIPT, *packages],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    return Warmup(proc)
