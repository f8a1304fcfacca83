"""A stack of three UltraServers with the whole product running (``dev up`` starts
discovery, the slice publisher and the kubelet plugin on every node, the topology allocator
and the operator)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fixtures.stack import REPO, KubeStack, ultraserver_stack

FLEET = REPO / "tests" / "fleets" / "ultraserver.yaml"


# Package scope: the stack stops when its package's tests are done, so the next
# package's stack never runs beside it on a small machine.
@pytest.fixture(scope="package")
def us_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeStack]:
    yield from ultraserver_stack(tmp_path_factory.mktemp("us-stack"), FLEET, ultraservers=3)
