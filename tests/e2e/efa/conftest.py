"""The EFA tests' stacks, each started with ``--efa`` (the simulated EFA DRA driver): the
small fleet (two trn2.48xlarge) for a claim of Neuron devices and EFA interfaces, and the
UltraServer fleet for a workload of two UltraServers. Module scope: one stack at a time."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.actuate.support import Actuate, bring_up
from tests.fixtures.stack import REPO, KubeStack, start_stack, stop_stack

ULTRASERVER_FLEET = REPO / "tests" / "fleets" / "ultraserver.yaml"


@pytest.fixture(scope="module")
def actuate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Actuate]:
    state_dir = tmp_path_factory.mktemp("efa-stack")
    stack = start_stack(state_dir, extra=["--efa"])
    try:
        yield from bring_up(stack)
    finally:
        stop_stack(state_dir)


@pytest.fixture(scope="module")
def us_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeStack]:
    state_dir = tmp_path_factory.mktemp("efa-us-stack")
    stack = start_stack(state_dir, fleet=ULTRASERVER_FLEET, extra=["--efa"])
    try:
        stack.wait_for(
            "three NeuronUltraServers",
            lambda: len(stack.get_json("nus", "-n", "neuron-dra-driver")["items"]) == 3,
            timeout=120,
        )
        yield stack
    finally:
        stop_stack(state_dir)
