"""NATS and the apiserver restart under the running product (kill -9, a few seconds away),
as in an upgrade or a crash: every service reconnects by itself, nothing of the stack stays
down, and what a user does next works: a device fault still becomes a taint on its device
(health probe -> NATS -> slice publisher -> apiserver), and a pod asking for four connected
devices is scheduled, prepared and Running.

The seconds from the component's return to each of these are printed (the goal is
10 s; speed is judged in benchmarks, not here).

A node's discovery restarted with SIGTERM (as a DaemonSet rolling update does) says goodbye:
the failure detector waits for it instead of declaring the node lost."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from neuron_dra_cli.restart_cmd import Restarted, restart_component

from tests.e2e.actuate.support import MANIFESTS
from tests.e2e.health.support import device_taints, fault, node_events
from tests.fixtures.stack import KubeStack, neuron_dra

pytestmark = [
    pytest.mark.stack,
    # A restarted component is started by this process and left running, as `dev up` leaves
    # the stack's processes; Python reports such a handle when it is collected.
    pytest.mark.filterwarnings("ignore:subprocess .* is still running:ResourceWarning"),
]

NODE = "trn2-48xl-1"
DEVICE = 5
NAME = f"neurondevice{DEVICE}"
AWAY_SECONDS = 3.0


@pytest.fixture
def stack(kube_stack: KubeStack) -> Iterator[KubeStack]:
    """The shared stack, its node repaired and the test's pod gone afterwards."""
    yield kube_stack
    fault(kube_stack, NODE, "repair")
    kube_stack.kubectl("delete", "pod", "pod0", "--ignore-not-found", "--timeout=120s")
    kube_stack.wait_for(
        f"{NODE} without taints",
        lambda: not any(device_taints(kube_stack, NODE).values()),
        timeout=120,
    )


def restart(stack: KubeStack, name: str) -> Restarted:
    done = restart_component(stack.state_dir, name=name, kill=True, down_seconds=AWAY_SECONDS)
    print(f"\n{name}: away {done.away_seconds:.1f} s (down {AWAY_SECONDS:.0f} s, then starting)")
    return done


def since(done: Restarted) -> float:
    return time.time() - done.back_at


def all_up(stack: KubeStack) -> bool:
    proc = neuron_dra("dev", "status", "--state-dir", str(stack.state_dir), "-o", "json")
    components = json.loads(proc.stdout)["components"]
    down = [c["name"] for c in components if not c["up"]]
    assert not down, f"down after the restart: {down}"
    return True


def fault_becomes_taint(stack: KubeStack, done: Restarted) -> float:
    fault(stack, NODE, "hbm", device=DEVICE)
    stack.wait_for(
        f"the taint on {NAME}",
        lambda: bool(device_taints(stack, NODE).get(NAME)),
        timeout=120,
    )
    return since(done)


def pod_runs(stack: KubeStack, done: Restarted) -> float:
    stack.kubectl("apply", "-f", str(MANIFESTS / "aws-dra-guide-1x4.yaml"))
    stack.kubectl("wait", "--for=condition=Ready", "pod/pod0", "--timeout=180s", timeout=200)
    return since(done)


def test_nats_restart(stack: KubeStack) -> None:
    stack.wait_for("the node's pool", lambda: NAME in device_taints(stack, NODE), timeout=120)
    done = restart(stack, "nats")
    taint = fault_becomes_taint(stack, done)
    pod = pod_runs(stack, done)
    all_up(stack)
    print(f"NATS back -> fault tainted {taint:.1f} s, connected-devices pod Ready {pod:.1f} s")


def test_apiserver_restart(stack: KubeStack) -> None:
    stack.wait_for("the node's pool", lambda: NAME in device_taints(stack, NODE), timeout=120)
    # Back means /readyz answers (restarting it, as the kubelet would, if it exits meanwhile).
    done = restart(stack, "kube-apiserver")
    pod = pod_runs(stack, done)
    taint = fault_becomes_taint(stack, done)
    all_up(stack)
    print(
        f"apiserver back ({done.starts} start(s)) -> connected-devices pod Ready {pod:.1f} s, "
        f"fault tainted {taint:.1f} s"
    )


def node_messages(stack: KubeStack, node: str, reason: str) -> list[str]:
    return [str(e["message"]) for e in node_events(stack, node, reason)]


def test_discovery_restart_on_a_node_is_not_a_lost_node(stack: KubeStack) -> None:
    """`neuron-dra dev restart discovery-NODE` (SIGTERM, away longer than three heartbeats):
    the failure detector waits for the agent, so no NodeLost and no node-lost taint."""
    stack.wait_for("the node's pool", lambda: NAME in device_taints(stack, NODE), timeout=120)
    done = restart_component(
        stack.state_dir, name=f"discovery-{NODE}", down_seconds=AWAY_SECONDS + 2
    )
    print(f"\ndiscovery-{NODE}: away {done.away_seconds:.1f} s")
    assert done.away_seconds > 3  # longer than the detector's usual window
    back = stack.wait_for(
        "the detector hearing the agent again",
        lambda: node_messages(stack, NODE, "NodeAgentRestarted"),
        timeout=120,
    )
    assert node_messages(stack, NODE, "NodeAgentRestarting")
    assert node_messages(stack, NODE, "NodeLost") == [], back
    assert not any(device_taints(stack, NODE).values()), device_taints(stack, NODE)
    all_up(stack)
