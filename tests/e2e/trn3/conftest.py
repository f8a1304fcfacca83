"""A stack of two Trn3 UltraServers (tests/fleets/trn3.yaml) with the whole product running."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fixtures.stack import REPO, KubeStack, start_stack, stop_stack

FLEET = REPO / "tests" / "fleets" / "trn3.yaml"


# Package scope: this package's stack stops before the next package's starts.
@pytest.fixture(scope="package")
def trn3_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeStack]:
    state_dir = tmp_path_factory.mktemp("trn3-stack")
    stack = start_stack(state_dir, fleet=FLEET)
    try:
        stack.wait_for(
            "two NeuronUltraServers",
            lambda: len(stack.get_json("nus", "-n", "neuron-dra-driver")["items"]) == 2,
            timeout=120,
        )
        yield stack
    finally:
        stop_stack(state_dir)
