"""The real node with the driver on the authenticated bus (``dev up --real-nodes 1
--real-node-driver --bus-auth``): a package of its own, so that its stack never runs beside
the plain one of the package above."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.realnode.conftest import real_node_stack
from tests.fixtures.stack import KubeStack


@pytest.fixture(scope="package")
def real_bus_auth_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeStack]:
    yield from real_node_stack(tmp_path_factory, name="real-bus-auth-stack", extra=("--bus-auth",))
