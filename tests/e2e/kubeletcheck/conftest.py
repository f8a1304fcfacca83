"""One stack on the oldest supported release with examples/kubelet-check/fleet.yaml: a node on
kubelet 1.34.1 (the real kubelet code of that release, built from its official module) beside
one on 1.34.4."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from neuron_dra_cli import kubebuild

from tests.e2e.actuate.support import Actuate, bring_up
from tests.fixtures.stack import REPO, KubeStack, start_stack, stop_stack

FLEET = REPO / "examples" / "kubelet-check" / "fleet.yaml"


@pytest.fixture(scope="package")
def kcheck_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeStack]:
    state_dir = tmp_path_factory.mktemp("kubelet-check-stack")
    stack = start_stack(state_dir, fleet=FLEET, k8s_version=kubebuild.FLOOR_VERSION)
    try:
        yield stack
    finally:
        stop_stack(state_dir)


@pytest.fixture(scope="package")
def kcheck(kcheck_stack: KubeStack) -> Iterator[Actuate]:
    yield from bring_up(kcheck_stack)
