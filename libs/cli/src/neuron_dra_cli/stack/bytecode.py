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

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Final

from neuron_dra_cli import paths

__all__ = ["PACKAGES", "Warmup", "is_warm", "python_env", "start_warmup"]

#: The packages the stack runs as services (and what they share): compiled here, and imported
#: once by the agent zygote.
PACKAGES: Final = (
    "neuron_dra_alerts",
    "neuron_dra_audit",
    "neuron_dra_bus_auth",
    "neuron_dra_common",
    "neuron_dra_device_plugin",
    "neuron_dra_discovery",
    "neuron_dra_health_monitor",
    "neuron_dra_kubelet_plugin",
    "neuron_dra_protos",
    "neuron_dra_scheduler_extender",
    "neuron_dra_slice_publisher",
    "neuron_dra_topology_allocator",
    "neuron_dra_ultraserver_operator",
)

# Imports every module of each package (not ``__main__``), which compiles them and all they
# import; one that cannot be imported here is left to compile where it is used. Then records
# the sources it read and their folders, with their times, so that the next start can tell
# that nothing changed without importing anything.
_SCRIPT: Final = """
import importlib, json, os, pkgutil, sys
manifest, tops = sys.argv[1], sys.argv[2:]
for top in tops:
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
files = {}
for module in list(sys.modules.values()):
    path = getattr(module, "__file__", None)
    if path and path.endswith(".py"):
        for name in (path, os.path.dirname(path)):
            try:
                files[name] = os.stat(name).st_mtime_ns
            except OSError:
                pass
with open(manifest + ".tmp", "w") as fh:
    json.dump({"executable": sys.executable, "packages": tops, "files": files}, fh)
os.replace(manifest + ".tmp", manifest)
"""


def pycache_dir() -> Path:
    return paths.cache_dir() / "pycache"


def python_env() -> dict[str, str]:
    """Environment of a Python service: bytecode from (and to) the shared cache.

    An empty ``PYTHONDONTWRITEBYTECODE`` counts as unset: the first process to import a
    module that is not compiled yet writes it there for the others.
    """
    return {"PYTHONPYCACHEPREFIX": str(pycache_dir()), "PYTHONDONTWRITEBYTECODE": ""}


def _manifest(packages: tuple[str, ...]) -> Path:
    key = hashlib.sha256("\0".join((sys.executable, *packages)).encode()).hexdigest()[:16]
    return pycache_dir() / f"warm-{key}.json"


def is_warm(packages: tuple[str, ...] = PACKAGES) -> bool:
    """True when the last warm-up of ``packages`` read the very sources there are now."""
    try:
        recorded = json.loads(_manifest(packages).read_text())
        files: dict[str, int] = recorded["files"]
        return bool(files) and all(os.stat(f).st_mtime_ns == t for f, t in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


class Warmup:
    """The compiling process, started early so it runs while the control plane starts."""

    def __init__(self, proc: subprocess.Popen[bytes] | None) -> None:
        self._proc = proc
        self._t0 = time.monotonic()
        self._seconds: float | None = None

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def wait(self, *, timeout: float = 300.0) -> float:
        """Wait until the bytecode is written; return how long compiling took. A failure
        only costs the services time."""
        if self._proc is None:
            return 0.0
        try:
            self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._seconds is None:
            self._seconds = time.monotonic() - self._t0
        return self._seconds


def start_warmup(packages: tuple[str, ...] = PACKAGES) -> Warmup:
    """Start compiling the services' modules in the background (nothing to do when the
    bytecode of the sources there are now is in the cache already)."""
    if is_warm(packages):
        return Warmup(None)
    manifest = _manifest(packages)
    manifest.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **python_env()}
    proc = subprocess.Popen(
        [sys.executable, "-c", _SCRIPT, str(manifest), *packages],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    return Warmup(proc)
