"""One stack on the oldest supported release for this package, with the whole product."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from neuron_dra_cli import kubebuild

from tests.e2e.actuate.support import Actuate, bring_up
from tests.fixtures.stack import REPO, KubeStack, start_stack, stop_stack

FLEET = REPO / "tests" / "fleets" / "floor.yaml"


# Package scope: the stack stops when this package is done, before the next large one starts.
@pytest.fixture(scope="package")
def floor_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeStack]:
    state_dir = tmp_path_factory.mktemp("floor-stack")
    stack = start_stack(state_dir, fleet=FLEET, k8s_version=kubebuild.FLOOR_VERSION)
    try:
        yield stack
    finally:
        stop_stack(state_dir)


@pytest.fixture(scope="package")
def floor_actuate(floor_stack: KubeStack) -> Iterator[Actuate]:
    yield from bring_up(floor_stack)
