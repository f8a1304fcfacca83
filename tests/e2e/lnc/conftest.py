"""A stack whose nodes differ in their default LNC (tests/fleets/trn3-lnc.yaml)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fixtures.stack import REPO, KubeStack, ultraserver_stack

FLEET = REPO / "tests" / "fleets" / "trn3-lnc.yaml"


# Package scope: this package's stack stops before the next package's starts.
@pytest.fixture(scope="package")
def lnc_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeStack]:
    yield from ultraserver_stack(tmp_path_factory.mktemp("lnc-stack"), FLEET, ultraservers=1)
