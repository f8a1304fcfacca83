"""One UltraServer stack started with ``dev up --tracing``: Jaeger runs beside it and every
neuron-dra service sends its spans there."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.stack import KubeStack, start_stack, stop_stack

FLEET = Path(__file__).resolve().parent / "fleet.yaml"


# Package scope: the stack stops when its package's tests are done, so the next
# package's stack never runs beside it on a small machine.
@pytest.fixture(scope="package")
def traced_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeStack]:
    state_dir = tmp_path_factory.mktemp("traced-stack")
    stack = start_stack(state_dir, fleet=FLEET, extra=["--tracing"])
    try:
        stack.wait_for(
            "the NeuronUltraServer",
            lambda: len(stack.get_json("nus", "-n", "neuron-dra-driver")["items"]) == 1,
            timeout=120,
        )
        yield stack
    finally:
        stop_stack(state_dir)
