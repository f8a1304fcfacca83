"""The session's stack with the kubelet plugin on every node (as the actuation tests use it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.actuate.support import Actuate, bring_up
from tests.fixtures.stack import KubeStack


@pytest.fixture(scope="session")
def actuate(kube_stack: KubeStack) -> Iterator[Actuate]:
    yield from bring_up(kube_stack)
