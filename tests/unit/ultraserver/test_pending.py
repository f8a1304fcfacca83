"""The Pending-pod loop's pure parts: when a pod is told again, which workload a pod is
of, and the ``PodsSchedulable`` condition a workload shows."""

from __future__ import annotations

from typing import Any

from neuron_dra_common.ultraserver import WORKLOAD_LABEL
from neuron_dra_ultraserver_operator.pending import (
    CONDITION,
    SignatureMemory,
    Verdict,
    pod_signature,
    waiting_for_devices,
    workload_condition,
    workload_of,
)

NOW = "2026-01-01T00:00:00Z"
LATER = "2026-01-01T00:05:00Z"


def test_a_pod_is_told_once_per_change_of_reasons() -> None:
    memory = SignatureMemory()
    said = [memory.changed("u1", sig) for sig in ("held", "held", "held", "selector", "held")]
    assert said == [True, False, False, True, True]
    # Pods are remembered apart.
    assert memory.changed("u2", "held") is True
    assert memory.changed("u1", "held") is False


def test_the_memory_is_bounded_and_forgets_the_oldest_said() -> None:
    memory = SignatureMemory(size=2)
    memory.changed("u1", "a")
    memory.changed("u2", "a")
    memory.changed("u1", "a")  # u1 said last: u2 is the oldest now
    memory.changed("u3", "a")
    assert len(memory) == 2
    assert memory.changed("u1", "a") is False
    assert memory.changed("u2", "a") is True  # forgotten: said again


def test_a_deleted_pod_is_forgotten() -> None:
    memory = SignatureMemory()
    memory.changed("u1", "a")
    memory.forget("u1")
    assert len(memory) == 0
    assert memory.changed("u1", "a") is True


def test_an_event_posted_before_the_process_led_is_not_repeated() -> None:
    memory = SignatureMemory()
    memory.seed({"u1": "DevicesHeld: 12 of 16 held", "u2": "NodeSelector: no node"})
    # The same message as the Event there: not told again, and remembered.
    assert memory.changed("u1", "sig-held", message="DevicesHeld: 12 of 16 held") is False
    assert memory.changed("u1", "sig-held", message="DevicesHeld: 12 of 16 held") is False
    # Another message than the Event there: told.
    assert memory.changed("u2", "sig-other", message="NotEnoughDevices: 12 < 13") is True
    # A pod without an earlier Event is told.
    assert memory.changed("u3", "sig", message="anything") is True


def test_a_seeded_message_is_compared_as_the_api_keeps_it() -> None:
    memory = SignatureMemory()
    long = "DevicesHeld: " + "x" * 2000
    memory.seed({"u1": long[:1024]})
    assert memory.changed("u1", "sig", message=long) is False


def _pod(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
        "spec": {"resourceClaims": [{"name": "n", "resourceClaimTemplateName": "t"}], **spec},
        "status": {
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
        },
    }


def test_only_unplaced_pods_with_claims_are_waiting_for_devices() -> None:
    assert waiting_for_devices(_pod())
    assert not waiting_for_devices(_pod(nodeName="n1"))
    assert not waiting_for_devices({**_pod(), "spec": {"containers": []}})
    assert not waiting_for_devices({**_pod(), "status": {}})  # not tried yet
    deleting = _pod()
    deleting["metadata"]["deletionTimestamp"] = NOW
    assert not waiting_for_devices(deleting)


def _workload(name: str, *, template: str = "", conditions: list[Any] | None = None) -> Any:
    status: dict[str, Any] = {}
    if template:
        status["resourceClaimTemplate"] = template
    if conditions is not None:
        status["conditions"] = conditions
    return {"metadata": {"name": name, "namespace": "ns", "generation": 3}, "status": status}


def test_a_pod_is_of_the_workload_its_claim_is_labelled_with() -> None:
    pod = _pod()
    pod["status"]["resourceClaimStatuses"] = [{"name": "n", "resourceClaimName": "p-n-abc"}]
    claims = {"ns/p-n-abc": {"metadata": {"labels": {WORKLOAD_LABEL: "job"}}}}
    workloads = {"ns/job": _workload("job"), "ns/other": _workload("other", template="t")}
    assert workload_of(pod, claims, workloads) == "ns/job"


def test_a_pod_without_its_claim_yet_is_of_the_workload_of_its_template() -> None:
    workloads = {"ns/job": _workload("job", template="t"), "ns/x": _workload("x", template="u")}
    assert workload_of(_pod(), {}, workloads) == "ns/job"
    # Another namespace's workload of the same template name is not this pod's.
    assert workload_of(_pod(), {}, {"other/job": _workload("job", template="t")}) == ""
    # A pod of no workload.
    assert workload_of(_pod(), {}, {}) == ""


def test_waiting_pods_make_the_condition_false_with_the_first_pods_reason() -> None:
    waiting = [
        Verdict("job-1", "NodeSelector", "NodeSelector: ..."),
        Verdict("job-0", "DevicesHeld", "DevicesHeld: 16 of 16 devices held"),
    ]
    cond = workload_condition(_workload("job"), waiting, now=NOW)
    assert cond is not None
    assert (cond["type"], cond["status"], cond["reason"]) == (CONDITION, "False", "DevicesHeld")
    assert cond["message"] == (
        "pod job-0 (and 1 more pods) cannot be scheduled: DevicesHeld: 16 of 16 devices held"
    )
    assert cond["lastTransitionTime"] == NOW
    assert cond["observedGeneration"] == 3
    # Shown already: nothing to write.
    assert workload_condition(_workload("job", conditions=[cond]), waiting, now=LATER) is None
    # Another reason: written, and the condition was False already (same transition time).
    other = workload_condition(
        _workload("job", conditions=[cond]), [Verdict("job-0", "NotConnected", "N")], now=LATER
    )
    assert other is not None
    assert (other["reason"], other["lastTransitionTime"]) == ("NotConnected", NOW)


def test_the_condition_turns_true_only_over_a_false_one() -> None:
    # A workload none of whose pods waited shows no condition (no write per workload).
    assert workload_condition(_workload("job"), [], now=NOW) is None
    false = workload_condition(_workload("job"), [Verdict("p", "DevicesHeld", "m")], now=NOW)
    assert false is not None
    cond = workload_condition(_workload("job", conditions=[false]), [], now=LATER)
    assert cond is not None
    assert (cond["status"], cond["reason"], cond["lastTransitionTime"]) == (
        "True",
        "NoPodWaiting",
        LATER,
    )
    assert workload_condition(_workload("job", conditions=[cond]), [], now=LATER) is None


def test_a_long_message_is_cut_to_what_the_api_keeps() -> None:
    cond = workload_condition(_workload("job"), [Verdict("p", "X", "m" * 5000)], now=NOW)
    assert cond is not None
    assert len(cond["message"]) == 1024


def _unschedulable(message: str, *, claims: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ml", "uid": "u1", "labels": {"app": "x"}},
        "spec": {"resourceClaims": [{"name": "n", "resourceClaimTemplateName": "t"}]},
        "status": {
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": message,
                    "lastProbeTime": None,
                }
            ],
            "resourceClaimStatuses": claims or [],
        },
    }


def test_the_schedulers_next_attempt_alone_does_not_explain_the_pod_again() -> None:
    """The scheduler rewrites its message at every attempt while nodes change: that alone is
    no reason to explain the pod again (the sweep follows the cluster). What explain reads of
    the pod is."""
    first = _unschedulable("0/1001 nodes are available: 75 Too many pods")
    again = _unschedulable("0/1001 nodes are available: 74 Too many pods")
    assert pod_signature(first) == pod_signature(again)
    claimed = _unschedulable("same", claims=[{"name": "n", "resourceClaimName": "p-n-x"}])
    assert pod_signature(claimed) != pod_signature(first)
    relabelled = _unschedulable("same")
    relabelled["metadata"]["labels"] = {"app": "y"}
    assert pod_signature(relabelled) != pod_signature(first)
    placed = _unschedulable("same")
    placed["status"]["conditions"][0].update(status="True", reason="")
    assert pod_signature(placed) != pod_signature(first)
    deleting = _unschedulable("same")
    deleting["metadata"]["deletionTimestamp"] = NOW
    assert pod_signature(deleting) != pod_signature(first)
