"""A local stack with one real node (the real kubelet with containerd and runc) beside one
simulated node, for the real-node tests of this package; the driver's own DaemonSets run on
the real node (``--real-node-driver``)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from neuron_dra_cli.stack import realnodes

from tests.fixtures.image import REQUIRE_ENV
from tests.fixtures.stack import REPO, KubeStack, start_stack, stop_stack

FLEET = REPO / "tests" / "fleets" / "bare.yaml"
REAL_NODE = "real-node-0"


def real_node_stack(
    tmp_path_factory: pytest.TempPathFactory, *, name: str, extra: tuple[str, ...] = ()
) -> Iterator[KubeStack]:
    """The stack of a package-scoped fixture: one real node with the driver, and ``extra``
    flags of ``dev up``. Skipped, with what is missing, where a real node cannot run (not
    root, no runc or CNI plugins); with ``NEURON_DRA_REQUIRE_IMAGE_TESTS=1`` (CI) that fails
    instead."""
    missing = realnodes.missing_requirements()
    if missing:
        reason = f"a real node needs {'; '.join(missing)}"
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{reason}; {REQUIRE_ENV}=1 says it must run")
        pytest.skip(reason)
    state_dir = tmp_path_factory.mktemp(name)
    stack = start_stack(
        state_dir, fleet=FLEET, extra=["--real-nodes", "1", "--real-node-driver", *extra]
    )
    try:
        yield stack
    finally:
        stop_stack(state_dir)


@pytest.fixture(scope="package")
def real_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeStack]:
    yield from real_node_stack(tmp_path_factory, name="real-stack")
