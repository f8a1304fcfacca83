"""The environment of the benchmarks' baseline client, kubernetes-asyncio, kept apart.

The ``slices`` and ``ultraserver`` scenarios measure the product against the official
asynchronous Kubernetes client doing the same writes. That client needs aiohttp, and nats-py
imports aiohttp whenever it is installed: in the workspace's ``.venv``, which the local stack's
services run from, every service process would carry it (about 12 MiB of memory each). So the
client is not in ``.venv``: it lives in a virtualenv of its own, made with uv on first use and
cached under ``<cache>/bench-baseline/<key>`` (``<cache>`` as ``neuron-dra`` keeps it,
``~/.cache/neuron-dra`` by default; the key hashes the pinned requirements and the
interpreter). The scenarios run their baseline as a script of ``bench/bare/`` (standard
library and kubernetes-asyncio only) with that environment's Python, in a child process that
takes its inputs and gives its measurements as JSON.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from neuron_dra_cli import paths
from neuron_dra_cli.cachelock import locked

__all__ = ["BARE", "REQUIREMENTS", "BaselineEnvError", "python", "run_script"]

#: The client and everything it imports, at the versions the workspace locked while the client
#: was among its dev dependencies.
REQUIREMENTS = (
    "kubernetes-asyncio==36.1.0",
    "aiohttp==3.14.5",
    "aiohappyeyeballs==2.7.1",
    "aiosignal==1.4.0",
    "attrs==26.1.0",
    "certifi==2026.10.18",
    "frozenlist==1.8.0",
    "idna==3.20",
    "multidict==7.2.1",
    "propcache==0.5.4",
    "python-dateutil==4.0.0",
    "pyyaml==6.0.3",
    "six==1.17.0",
    "typing-extensions==4.16.0",
    "tzdata==2026.6",
    "urllib3==2.8.0",
    "yarl==1.25.1",
)
#: The baseline scripts.
BARE = Path(__file__).resolve().parent / "bare"


class BaselineEnvError(RuntimeError):
    """The baseline environment could not be made, or a baseline script failed."""


def _interpreter() -> Path:
    """The interpreter running the bench (through ``.venv``'s link, the installed one)."""
    return Path(sys.executable).resolve()


def _key() -> str:
    text = "\n".join([str(_interpreter()), sys.version, *REQUIREMENTS])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _uv() -> str:
    """``uv`` on PATH, else the one scripts/bootstrap.sh keeps in the cache."""
    found = shutil.which("uv")
    if found:
        return found
    cached = sorted(paths.cache_dir().glob("uv/*/uv"))
    if cached:
        return str(cached[-1])
    raise BaselineEnvError(
        "uv is needed to make the bench's baseline environment: it is neither on PATH nor in "
        f"{paths.cache_dir() / 'uv'} (`source scripts/bootstrap.sh` puts it there)"
    )


def _run(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=900)
    if proc.returncode != 0:
        raise BaselineEnvError(
            f"making the bench's baseline environment failed: `{' '.join(argv)}` exited "
            f"{proc.returncode}:\n{(proc.stdout + proc.stderr).strip()}"
        )


def python() -> Path:
    """The baseline environment's Python, the environment made first if it is not there yet.

    It is made in a temporary folder beside its place and renamed into it once complete, so
    a folder at its place is always whole; a lock keeps two benches from making it at once.
    """
    root = paths.cache_dir() / "bench-baseline"
    home = root / _key()
    exe = home / "bin" / "python"
    if exe.is_file():
        return exe

    def progress(message: str) -> None:
        print(f"bench: {message}", file=sys.stderr, flush=True)

    with locked(
        root / ".lock", progress=progress, what="another bench making the baseline environment"
    ):
        if exe.is_file():
            return exe
        uv = _uv()
        progress(f"making the baseline environment ({REQUIREMENTS[0]}) in {home} with {uv}")
        with tempfile.TemporaryDirectory(prefix=".build-", dir=root) as tmp:
            build = Path(tmp) / "venv"
            _run(
                [
                    uv,
                    "venv",
                    "--quiet",
                    "--no-project",
                    "--relocatable",
                    "--python",
                    str(_interpreter()),
                    str(build),
                ]
            )
            built = build / "bin" / "python"
            _run([uv, "pip", "install", "--quiet", "--python", str(built), *REQUIREMENTS])
            _run([str(built), "-c", "import kubernetes_asyncio.client"])
            if home.exists():  # left incomplete by hand
                shutil.rmtree(home)
            os.rename(build, home)
    return exe


async def run_script(name: str, inputs: Any) -> Any:
    """Run ``bench/bare/<name>`` with the baseline environment's Python, ``inputs`` as JSON
    on its standard input; returns the JSON it prints."""
    proc = await asyncio.create_subprocess_exec(
        str(python()),
        str(BARE / name),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    out, _ = await proc.communicate(json.dumps(inputs).encode())
    if proc.returncode != 0:
        raise BaselineEnvError(f"bench/bare/{name} exited {proc.returncode} (its error is above)")
    return json.loads(out)
