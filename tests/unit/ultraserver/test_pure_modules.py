"""The operator's deciding modules load no client of the API, the bus or gRPC: they can be
read, tested and reused without any of them."""

from __future__ import annotations

import subprocess
import sys

import pytest

PURE = ("model", "records", "manifests", "statuses", "inputs", "actions", "decide", "discovery")
CLIENTS = (
    "neuron_dra_common.kube",
    "neuron_dra_common.bus",
    "grpc",
    "nats",
    "kubernetes_asyncio",
    "aiohttp",
)


@pytest.mark.parametrize("module", PURE)
def test_a_deciding_module_loads_no_client(module: str) -> None:
    probe = (
        "import sys\n"
        f"import neuron_dra_ultraserver_operator.{module}\n"
        f"clients = {CLIENTS!r}\n"
        "print(sorted({m for m in sys.modules for c in clients if m == c or m.startswith(c + '.')}))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert loaded == "[]", f"neuron_dra_ultraserver_operator.{module} loads {loaded}"
