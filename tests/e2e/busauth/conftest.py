"""One local stack as ``neuron-dra dev up`` starts it without flags: the authenticated bus."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fixtures.stack import KubeStack, start_stack, stop_stack


# Package-scoped: the stack is stopped once this package's tests are done, so that it does not
# run beside the stacks of the packages after it.
@pytest.fixture(scope="package")
def bus_auth_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeStack]:
    state_dir = tmp_path_factory.mktemp("bus-auth-stack")
    stack = start_stack(state_dir)
    try:
        yield stack
    finally:
        stop_stack(state_dir)
