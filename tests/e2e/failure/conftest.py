"""The default local stack (``deploy/fleets/default.yaml``: three UltraServers of four
trn2u nodes beside single nodes), as a user starts it, for node-failure runs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fixtures.stack import REPO, KubeStack, ultraserver_stack

FLEET = REPO / "deploy" / "fleets" / "default.yaml"


@pytest.fixture(scope="module")
def default_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeStack]:
    yield from ultraserver_stack(
        tmp_path_factory.mktemp("failure-stack"), FLEET, ultraservers=3, timeout=180
    )
