"""``kill -9`` at every step of prepare and unprepare: after a restart the claim converges
to prepared (or cleanly unprepared), no CDI spec or device is leaked, and no device is held
by two claims. The plugin stops itself at the step named by its crash-point variable."""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Iterator

import pytest
from neuron_dra_kubelet_plugin.faults import CRASH_ENV, STEPS

from tests.e2e.actuate.pods import claim_pod
from tests.e2e.actuate.support import Actuate

pytestmark = pytest.mark.stack

NODE = "trn2-48xl-1"
BYSTANDER = "crash-bystander"


def assert_consistent(actuate: Actuate, expected: set[str]) -> None:
    """Exactly ``expected`` claims are prepared on the node, each device held once."""
    specs = actuate.cdi_specs(NODE)
    entries = actuate.checkpoint(NODE)
    assert set(specs) == expected, f"CDI specs {sorted(specs)}, expected {sorted(expected)}"
    assert set(entries) == expected
    assert all(e["state"] == "PrepareCompleted" for e in entries.values())
    held = Counter(d["device"] for e in entries.values() for d in e["devices"])
    assert all(n == 1 for n in held.values()), held
    for uid, spec in specs.items():
        nodes = {n.path for d in spec.devices for n in d.container_edits.device_nodes}
        held_by_claim = {d["device"] for d in entries[uid]["devices"]}
        assert nodes == {f"/dev/neuron{d.removeprefix('neurondevice')}" for d in held_by_claim}


def restart_normally(actuate: Actuate) -> None:
    actuate.start_plugin(NODE)
    actuate.wait_plugin_ready(NODE)


def crash_at(actuate: Actuate, step: str) -> None:
    actuate.kill_plugin(NODE)
    actuate.start_plugin(NODE, env={CRASH_ENV: step})
    actuate.wait_plugin_ready(NODE)


@pytest.fixture(scope="module")
def bystander(actuate: Actuate) -> Iterator[str]:
    """A claim prepared before the crashes, which must survive every one of them."""
    actuate.apply(claim_pod(BYSTANDER, node=NODE, count=1))
    actuate.wait_running(BYSTANDER)
    uid: str = actuate.claim_of(BYSTANDER)["metadata"]["uid"]
    yield uid
    actuate.delete_pod(BYSTANDER)


@pytest.mark.parametrize("step", [s for s in STEPS if s.startswith("prepare:")])
def test_kill_during_prepare_converges(actuate: Actuate, bystander: str, step: str) -> None:
    name = f"crash-{step.replace(':', '-')}"
    crash_at(actuate, step)
    actuate.apply(claim_pod(name, node=NODE, count=4))
    assert actuate.wait_exited(NODE, timeout=90) == -signal.SIGKILL
    restart_normally(actuate)
    try:
        actuate.wait_running(name, timeout=120)
        uid = actuate.claim_of(name)["metadata"]["uid"]
        assert_consistent(actuate, {bystander, uid})
    finally:
        actuate.delete_pod(name)
    assert_consistent(actuate, {bystander})


@pytest.mark.parametrize("step", [s for s in STEPS if s.startswith("unprepare:")])
def test_kill_during_unprepare_converges(actuate: Actuate, bystander: str, step: str) -> None:
    name = f"crash-{step.replace(':', '-')}"
    actuate.apply(claim_pod(name, node=NODE, count=4))
    actuate.wait_running(name, timeout=120)
    uid = actuate.claim_of(name)["metadata"]["uid"]
    crash_at(actuate, step)
    actuate.stack.kubectl("delete", "pod", name, "--wait=false")
    assert actuate.wait_exited(NODE, timeout=90) == -signal.SIGKILL
    restart_normally(actuate)
    actuate.delete_pod(name, timeout=120)
    assert uid not in actuate.cdi_specs(NODE)
    assert_consistent(actuate, {bystander})
