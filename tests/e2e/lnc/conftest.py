"""A stack whose nodes differ in their default LNC (tests/fleets/trn3-lnc.yaml)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fixtures.stack import REPO, KubeStack, start_stack, stop_stack

FLEET = REPO / "tests" / "fleets" / "trn3-lnc.yaml"


# Package scope: this package's stack stops before the next package's starts.
@pytest.fixture(scope="package")
def lnc_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeStack]:
    state_dir = tmp_path_factory.mktemp("lnc-stack")
    stack = start_stack(state_dir, fleet=FLEET)
    try:
        stack.wait_for(
            "the Trn3 UltraServer",
            lambda: len(stack.get_json("nus", "-n", "neuron-dra-driver")["items"]) == 1,
            timeout=120,
        )
        yield stack
    finally:
        stop_stack(state_dir)
