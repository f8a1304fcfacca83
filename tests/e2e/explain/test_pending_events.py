"""Why a pod is Pending, where a user already looks: ``kubectl describe pod`` shows one
``NeuronUnschedulable`` Event per change of the reasons (not one per scheduling attempt), and
``kubectl describe nusw`` shows the workload's ``PodsSchedulable`` condition.

The stack runs the whole product (the UltraServer operator among it) on the fleet of
``tests/fleets/pending.yaml``: one UltraServer of four trn2u nodes."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.ultraserver.converged import deployment, wait_state, workload
from tests.fixtures.stack import REPO, KubeStack, ultraserver_stack

pytestmark = pytest.mark.stack

FLEET = REPO / "tests" / "fleets" / "pending.yaml"
POKE = "example.com/poke"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeStack]:
    yield from ultraserver_stack(tmp_path_factory.mktemp("pending"), FLEET, ultraservers=1)


@pytest.fixture
def ns(stack: KubeStack) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    stack.create_namespace(name)
    try:
        yield name
    finally:
        stack.kubectl("delete", "namespace", name, "--wait=false", check=False)


def events(stack: KubeStack, ns: str, pod: str, reason: str) -> list[dict[str, Any]]:
    selector = f"involvedObject.name={pod},reason={reason}"
    items: list[dict[str, Any]] = stack.get_json("events", "-n", ns, "--field-selector", selector)[
        "items"
    ]
    return sorted(items, key=lambda e: e["metadata"]["creationTimestamp"])


def attempts(stack: KubeStack, ns: str, pod: str) -> int:
    """The scheduling attempts the scheduler's FailedScheduling Events count (it records a
    repeat of the same message as the Event's series, at once for the second)."""
    return sum(
        max(int(e.get("count") or 1), int((e.get("series") or {}).get("count") or 1))
        for e in events(stack, ns, pod, "FailedScheduling")
    )


#: 32 trn2.48xlarge devices: more than a node has (and this fleet's nodes are trn2u).
TOO_MANY = REPO / "examples" / "explain" / "too-many-neurons.yaml"


def test_one_event_per_change_of_reasons(stack: KubeStack, ns: str) -> None:
    stack.kubectl("apply", "-n", ns, "-f", str(TOO_MANY))
    first = stack.wait_for(
        "a NeuronUnschedulable Event on the pod",
        lambda: events(stack, ns, "too-many-neurons", "NeuronUnschedulable"),
        timeout=90,
    )
    assert len(first) == 1
    said = first[0]
    assert said["type"] == "Warning"
    assert said["source"]["component"] == "neuron-dra-explain"
    assert said["message"].startswith("RequestSelector"), said["message"]
    assert "instanceType == 'trn2.48xlarge'" in said["message"], said["message"]
    # kubectl describe shows it with the pod.
    described = stack.kubectl("describe", "pod", "too-many-neurons", "-n", ns).stdout
    assert "NeuronUnschedulable" in described

    # The scheduler tries again at each Node label change (its DRA plugin asks for that),
    # and the operator looks again too: the reasons are the same, so nothing more is said.
    nodes = [n["metadata"]["name"] for n in stack.get_json("nodes")["items"]]
    try:
        for round_ in range(1, 3):
            stack.kubectl("label", "node", nodes[0], f"{POKE}={round_}", "--overwrite")
            time.sleep(1)
        stack.wait_for(
            "the scheduler to try again",
            lambda: attempts(stack, ns, "too-many-neurons") >= 2,
            timeout=60,
        )
        # Each label change has the operator explain the pod again about a second later.
        time.sleep(5)
        assert len(events(stack, ns, "too-many-neurons", "NeuronUnschedulable")) == 1

        # Another reason on one node (cordoned): said once more, with the new reasons.
        stack.kubectl("cordon", nodes[0])
        second = stack.wait_for(
            "a second NeuronUnschedulable Event",
            lambda: events(stack, ns, "too-many-neurons", "NeuronUnschedulable")[1:],
            timeout=90,
        )
        assert len(second) == 1
        assert second[0]["message"] != said["message"]
        assert f"{nodes[0]}: node {nodes[0]} is cordoned" in second[0]["message"], second[0]
    finally:
        stack.kubectl("uncordon", nodes[0], check=False)
        stack.kubectl("label", "node", nodes[0], f"{POKE}-", check=False)


def test_a_workload_whose_pods_cannot_be_placed_says_why(stack: KubeStack) -> None:
    stack.kubectl("apply", "-f", "-", input=workload("pending-wl", size=4))
    wait_state(stack, "pending-wl", "Allocated")
    # Five pods on the four nodes the workload holds: one waits.
    manifest = deployment("pending-wl", template="pending-wl", replicas=5)
    stack.kubectl("apply", "-n", "default", "-f", "-", input=manifest)
    try:

        def condition() -> dict[str, Any] | None:
            nusw = stack.get_json("nusw", "pending-wl", "-n", "default")
            for c in nusw.get("status", {}).get("conditions") or ():
                if c["type"] == "PodsSchedulable" and c["status"] == "False":
                    return dict(c)
            return None

        cond = stack.wait_for("PodsSchedulable=False on the workload", condition, timeout=180)
        assert cond["reason"], cond
        assert "cannot be scheduled" in cond["message"]
        described = stack.kubectl("describe", "nusw", "pending-wl", "-n", "default").stdout
        assert "PodsSchedulable" in described
        assert cond["reason"] in described

        # The waiting pod carries the same reason as its Event.
        pods = stack.get_json("pods", "-n", "default", "-l", "app=pending-wl")["items"]
        waiting = [p["metadata"]["name"] for p in pods if not p["spec"].get("nodeName")]
        assert len(waiting) == 1
        said = stack.wait_for(
            "the waiting pod's Event",
            lambda: events(stack, "default", waiting[0], "NeuronUnschedulable"),
            timeout=60,
        )
        assert said[0]["message"].startswith(cond["reason"]), said[0]["message"]

        # Four pods for four nodes: none waits, and the workload says so.
        stack.kubectl("scale", "deployment", "pending-wl", "-n", "default", "--replicas=4")

        def schedulable() -> bool:
            nusw = stack.get_json("nusw", "pending-wl", "-n", "default")
            return any(
                c["type"] == "PodsSchedulable" and c["status"] == "True"
                for c in nusw.get("status", {}).get("conditions") or ()
            )

        stack.wait_for("PodsSchedulable=True once no pod waits", schedulable, timeout=90)
    finally:
        stack.kubectl("delete", "deployment", "pending-wl", "-n", "default", check=False)
        stack.kubectl("delete", "nusw", "pending-wl", "--timeout=120s", check=False)


def test_the_operator_may_do_exactly_this(stack: KubeStack) -> None:
    # The stack runs the operator with its own ServiceAccount (deploy/ RBAC): what the loop
    # needs is granted, and no more than reading is added.
    user = "system:serviceaccount:neuron-dra-driver:neuron-dra-ultraserver-operator"
    for verb, what in (
        ("watch", "pods"),
        ("watch", "resourceclaims.resource.k8s.io"),
        ("watch", "deviceclasses.resource.k8s.io"),
        ("list", "events"),
    ):
        proc = stack.kubectl("auth", "can-i", verb, what, "--all-namespaces", "--as", user)
        assert proc.stdout.strip() == "yes", (verb, what)
    for verb, what in (("patch", "pods"), ("delete", "events"), ("create", "deviceclasses")):
        proc = stack.kubectl(
            "auth", "can-i", verb, what, "--all-namespaces", "--as", user, check=False
        )
        assert proc.stdout.strip() == "no", (verb, what)
