"""The default local stack (``deploy/fleets/default.yaml``: three UltraServers of four
trn2u nodes beside single nodes), as a user starts it, for node-failure runs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fixtures.stack import REPO, KubeStack, start_stack, stop_stack

FLEET = REPO / "deploy" / "fleets" / "default.yaml"


@pytest.fixture(scope="module")
def default_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeStack]:
    state_dir = tmp_path_factory.mktemp("failure-stack")
    stack = start_stack(state_dir, fleet=FLEET)
    try:
        stack.wait_for(
            "three NeuronUltraServers",
            lambda: len(stack.get_json("nus", "-n", "neuron-dra-driver")["items"]) == 3,
            timeout=180,
        )
        yield stack
    finally:
        stop_stack(state_dir)
