"""How the benchmarks run their baseline client: a child process of the same environment.

The ``slices`` and ``ultraserver`` scenarios measure the product against a bare program on
kubernetes-asyncio alone doing the same writes. The product's environment has that client
(it is the product's own transport), so the baseline runs from it: a script of
``bench/bare/`` (standard library and kubernetes-asyncio only), started with this
interpreter in a child process of its own, so its CPU time is measured apart from the bench's.
It takes its inputs and gives its measurements as JSON.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["BARE", "BaselineEnvError", "python", "run_script"]

#: The baseline scripts.
BARE = Path(__file__).resolve().parent / "bare"


class BaselineEnvError(RuntimeError):
    """A baseline script failed."""


def python() -> Path:
    """The interpreter the baseline scripts run with: the bench's own."""
    return Path(sys.executable)


async def run_script(name: str, inputs: Any) -> Any:
    """Run ``bench/bare/<name>`` with :func:`python`, ``inputs`` as JSON on its standard
    input; returns the JSON it prints."""
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
