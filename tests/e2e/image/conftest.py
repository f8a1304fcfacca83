"""A local stack for the image tests (tests/fleets/image.yaml): the containers talk to its
NATS and apiserver over the host's network."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator

import pytest

from tests.fixtures.stack import REPO, KubeStack, start_stack, stop_stack

FLEET = REPO / "tests" / "fleets" / "image.yaml"
#: The node the stack runs no agents for: its discovery and kubelet plugin run as containers.
CONTAINER_NODE = "ctr-trn2-0"
NAMESPACE = "neuron-dra-driver"


@pytest.fixture(scope="package")
def image_stack(image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeStack]:
    """``image`` first: without an engine the tests are skipped before a stack starts."""
    state_dir = tmp_path_factory.mktemp("image-stack")
    stack = start_stack(state_dir, fleet=FLEET)
    try:
        yield stack
    finally:
        stop_stack(state_dir)


def stop_stack_component(stack: KubeStack, kind: str) -> None:
    """Stop the stack's own process(es) of ``kind`` (a container takes over its work)."""
    components = json.loads((stack.state_dir / "state.json").read_text())["components"]
    pids = [c["pid"] for c in components if c["kind"] == kind]
    assert pids, f"the stack runs no {kind}"
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in pids), f"the stack's {kind} did not stop"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False
