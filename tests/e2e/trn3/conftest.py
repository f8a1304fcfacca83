"""A stack of two Trn3 UltraServers (tests/fleets/trn3.yaml) with the whole product running."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fixtures.stack import REPO, KubeStack, ultraserver_stack

FLEET = REPO / "tests" / "fleets" / "trn3.yaml"


# Package scope: this package's stack stops before the next package's starts.
@pytest.fixture(scope="package")
def trn3_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeStack]:
    yield from ultraserver_stack(tmp_path_factory.mktemp("trn3-stack"), FLEET, ultraservers=2)
