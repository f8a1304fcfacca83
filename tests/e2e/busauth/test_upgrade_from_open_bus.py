"""Upgrading the local stack from the open bus (``--insecure-bus``) to the default one: the
events stored before are still there afterwards, read as the bus's reader."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.stack import KubeStack, neuron_dra, start_stack, stop_stack

pytestmark = pytest.mark.stack


def _inventories(stack: KubeStack) -> set[str]:
    """The ids of the inventory events ``neuron-dra events`` shows (all of the last hour)."""
    out = neuron_dra(
        "events", "--state-dir", str(stack.state_dir), "--since", "1h", "-o", "json", timeout=120
    )
    assert out.returncode == 0, out.stderr
    events = [json.loads(line) for line in out.stdout.splitlines()]
    return {e["id"] for e in events if e["type"] == "com.aws.neuron.node.inventory.v1"}


@pytest.fixture
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    state = tmp_path_factory.mktemp("upgrade-stack")
    try:
        yield state
    finally:
        stop_stack(state)


def test_the_events_of_the_open_bus_are_read_on_the_authenticated_one(state_dir: Path) -> None:
    old = start_stack(state_dir, extra=["--insecure-bus"])
    before = old.wait_for("inventories on the open bus", lambda: _inventories(old))
    stop_stack(state_dir)
    new = start_stack(state_dir)
    # The same stack, now authenticated: `events` reads as the reader, over TLS.
    assert (state_dir / "bus-auth" / "tokens" / "neuron-dra-bus-reader.token").exists()
    after = new.wait_for("the earlier inventories", lambda: before <= _inventories(new) or None)
    assert after
