"""A local stack for the image tests (tests/fleets/image.yaml): the containers talk to its
NATS and apiserver over the host's network."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from neuron_dra_cli.stack import process

from tests.fixtures.stack import REPO, KubeStack, start_stack, stop_stack

FLEET = REPO / "tests" / "fleets" / "image.yaml"
#: The node the stack runs no agents for: its discovery and kubelet plugin run as containers.
CONTAINER_NODE = "ctr-trn2-0"
NAMESPACE = "neuron-dra-driver"


@pytest.fixture(scope="package")
def image_stack(image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeStack]:
    """``image`` first: without an engine the tests are skipped before a stack starts."""
    state_dir = tmp_path_factory.mktemp("image-stack")
    # The containers get no token or CA mounted: they reach the stack's NATS as an open bus,
    # and each says so in its log.
    stack = start_stack(state_dir, fleet=FLEET, extra=["--insecure-bus"])
    try:
        yield stack
    finally:
        stop_stack(state_dir)


def stop_stack_component(stack: KubeStack, kind: str) -> None:
    """Stop the stack's own process(es) of ``kind`` (a container takes over its work); one a
    test before stopped already is left alone (its pid may be another process's by now)."""
    components = json.loads((stack.state_dir / "state.json").read_text())["components"]
    procs = [
        process.Running(pid=c["pid"], start_ticks=c["start_ticks"])
        for c in components
        if c["kind"] == kind
    ]
    assert procs, f"the stack runs no {kind}"
    process.stop(procs, timeout=30)
    assert not any(process.alive(p) for p in procs), f"the stack's {kind} did not stop"
