"""The EFA tests' stacks, each started with ``--efa`` (the simulated EFA DRA driver): the
small fleet (two trn2.48xlarge) for a claim of Neuron devices and EFA interfaces, and the
UltraServer fleets (trn2u, and Trn3 in a module of its own) for a workload of two
UltraServers. Module scope: one stack at a time."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.actuate.support import Actuate, bring_up
from tests.fixtures.stack import REPO, KubeStack, start_stack, stop_stack, ultraserver_stack

ULTRASERVER_FLEET = REPO / "tests" / "fleets" / "ultraserver.yaml"
TRN3_FLEET = REPO / "tests" / "fleets" / "trn3.yaml"


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
    state_dir = tmp_path_factory.mktemp("efa-ultraserver-stack")
    yield from ultraserver_stack(state_dir, ULTRASERVER_FLEET, ultraservers=3, extra=["--efa"])


@pytest.fixture(scope="module")
def trn3_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeStack]:
    state_dir = tmp_path_factory.mktemp("efa-trn3-stack")
    yield from ultraserver_stack(state_dir, TRN3_FLEET, ultraservers=2, extra=["--efa"])
