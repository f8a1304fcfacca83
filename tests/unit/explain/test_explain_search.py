"""The verdict per node on pools the slice publisher builds: each feature the product uses, the
reason a user reads, and the scheduler-error and cannot-evaluate cases."""

from typing import Any

import msgspec
from neuron_dra_cli.explain_cmd import drawings
from neuron_dra_common.explain import (
    Explanation,
    Snapshot,
    explain_claim,
    explain_pod,
    explain_workload,
    render_text,
    to_json,
)

from tests.unit.explain.cluster import NEURON_CLASS, claim, node, pod, request, slices, snapshot

TRN2 = "device.attributes['neuron.aws.com'].instanceType == 'trn2.48xlarge'"
GROUP4 = "resource.aws.com/devicegroup4_id"


def chips(*indices: int) -> list[str]:
    return [f"neurondevice{i}" for i in indices]


def verdicts(exp: Explanation) -> dict[str, str]:
    return {name: entry.verdict for name, entry in exp.nodes.items()}


def codes(exp: Explanation, node_name: str) -> list[str]:
    return [r.code for r in exp.groups[exp.nodes[node_name].group].reasons]


def test_exact_count_fits_where_enough_devices_pass_the_selector() -> None:
    snap = snapshot(
        {"trn2-0": "trn2.48xlarge", "inf2-0": "inf2.48xlarge"},
        claim("c", request("neurons", 4, TRN2)),
        pod("p", "c"),
    )
    exp = explain_pod(snap, "default", "p")
    assert verdicts(exp) == {"inf2-0": "does-not-fit", "trn2-0": "fits"}
    assert exp.summary.schedulable
    assert exp.top_code() == ""
    assert codes(exp, "inf2-0") == ["RequestSelector"]
    message = exp.groups[exp.nodes["inf2-0"].group].reasons[0].message
    assert "12 of 12 devices" in message
    assert 'instanceType is "inf2.48xlarge" on neurondevice0' in message


def test_more_devices_than_a_node_has_is_not_enough_devices() -> None:
    snap = snapshot({"trn2-0": "trn2.48xlarge"}, claim("c", request("neurons", 32)), pod("p", "c"))
    exp = explain_pod(snap, "default", "p")
    assert verdicts(exp) == {"trn2-0": "does-not-fit"}
    assert exp.top_code() == "NotEnoughDevices"
    assert "asks for 32 devices; the node has 16" in exp.event_message()


def test_devices_held_by_another_claim_name_the_holder() -> None:
    snap = snapshot(
        {"trn2-0": "trn2.48xlarge"},
        claim("holder", request("neurons", 14), allocated_on="trn2-0", devices=chips(*range(14))),
        claim("c", request("neurons", 4)),
        pod("p", "c"),
    )
    exp = explain_pod(snap, "default", "p")
    (reason,) = exp.groups[0].reasons
    assert reason.code == "DevicesHeld"
    assert reason.details["by"] == [{"claim": "default/holder", "devices": chips(*range(14))}]
    assert exp.event_message().startswith("DevicesHeld: trn2-0: 14 of 16 devices are held")


def test_admin_access_sees_held_devices() -> None:
    snap = snapshot(
        {"trn2-0": "trn2.48xlarge"},
        claim("holder", request("neurons", 16), allocated_on="trn2-0", devices=chips(*range(16))),
        claim("monitor", request("neurons", allocationMode="All", adminAccess=True)),
        claim("c", request("neurons", 1)),
        pod("p", "monitor"),
        pod("q", "c"),
    )
    assert verdicts(explain_pod(snap, "default", "p")) == {"trn2-0": "fits"}
    assert verdicts(explain_pod(snap, "default", "q")) == {"trn2-0": "does-not-fit"}
    # An allocated admin-access claim holds nothing: the scheduler leaves it out of its in-use set.
    monitor = claim(
        "m",
        request("neurons", 16, adminAccess=True),
        allocated_on="trn2-0",
        devices=chips(*range(16)),
    )
    for result in monitor["status"]["allocation"]["devices"]["results"]:
        result["adminAccess"] = True
    watched = snapshot(
        {"trn2-0": "trn2.48xlarge"}, monitor, claim("c", request("neurons", 16)), pod("q", "c")
    )
    assert verdicts(explain_pod(watched, "default", "q")) == {"trn2-0": "fits"}


def test_all_mode_needs_every_matching_device_free() -> None:
    snap = snapshot(
        {"trn2-0": "trn2.48xlarge", "trn2-1": "trn2.48xlarge"},
        claim("holder", request("neurons", 1), allocated_on="trn2-0", devices=chips(5)),
        claim("c", request("neurons", allocationMode="All")),
        pod("p", "c"),
    )
    exp = explain_pod(snap, "default", "p")
    assert verdicts(exp) == {"trn2-0": "does-not-fit", "trn2-1": "fits"}
    assert codes(exp, "trn2-0") == ["DevicesHeld"]


def test_match_attribute_reports_the_largest_connected_group() -> None:
    # One device held in each group of four: 12 free devices, but no four share a group.
    snap = snapshot(
        {"trn2-0": "trn2.48xlarge"},
        claim("holder", request("neurons", 4), allocated_on="trn2-0", devices=chips(0, 4, 8, 12)),
        claim("c", request("neurons", 4), constraints=[{"matchAttribute": GROUP4}]),
        pod("p", "c"),
    )
    exp = explain_pod(snap, "default", "p")
    assert verdicts(exp) == {"trn2-0": "does-not-fit"}
    reason = next(r for r in exp.groups[0].reasons if r.code == "NotConnected")
    assert reason.details["need"] == 4
    assert reason.details["largest"] == 3
    assert sorted(len(v) for v in reason.details["groups"].values()) == [3, 3, 3, 3]
    # The text output draws the node's devices as `topology show` does, holder marked.
    picture = drawings(exp, snap)
    assert picture.startswith("\nThe devices of trn2-0 (as `neuron-dra topology show trn2-0`")
    assert "row 0 [ 0 A]-[ 1 .]-[ 2 .]-[ 3 .]" in picture
    assert "A  default/holder" in picture


def test_match_attribute_fits_when_one_group_is_whole() -> None:
    snap = snapshot(
        {"trn2-0": "trn2.48xlarge"},
        claim("holder", request("neurons", 3), allocated_on="trn2-0", devices=chips(0, 4, 8)),
        claim("c", request("neurons", 4), constraints=[{"matchAttribute": GROUP4}]),
        pod("p", "c"),
    )
    assert verdicts(explain_pod(snap, "default", "p")) == {"trn2-0": "fits"}


def test_match_attribute_over_two_requests_is_not_connected_not_a_conflict() -> None:
    # One device held in each row of four: each request of 2 finds 3 free in a row, but the
    # two together need 4 that share one row.
    two = [request("a", 2), request("b", 2)]
    snap = snapshot(
        {"trn2-0": "trn2.48xlarge"},
        claim("holder", request("neurons", 4), allocated_on="trn2-0", devices=chips(0, 4, 8, 12)),
        claim("c", *two, constraints=[{"matchAttribute": GROUP4}]),
        pod("p", "c"),
    )
    exp = explain_pod(snap, "default", "p")
    assert verdicts(exp) == {"trn2-0": "does-not-fit"}
    assert codes(exp, "trn2-0") == ["NotConnected"]
    reason = exp.groups[0].reasons[0]
    assert reason.request == "a, b"
    assert reason.details["need"] == 4
    assert reason.details["largest"] == 3
    # A whole row left: the two requests fit together there.
    whole = snapshot(
        {"trn2-0": "trn2.48xlarge"},
        claim("holder", request("neurons", 3), allocated_on="trn2-0", devices=chips(0, 4, 8)),
        claim("c", *two, constraints=[{"matchAttribute": GROUP4}]),
        pod("p", "c"),
    )
    assert verdicts(explain_pod(whole, "default", "p")) == {"trn2-0": "fits"}


def test_untolerated_device_taint_blocks_and_a_toleration_lifts_it() -> None:
    taint = {"key": "neuron.aws.com/hardware-error", "value": "true", "effect": "NoSchedule"}
    tainted = slices("trn2-0", taints={f"neurondevice{i}": [taint] for i in range(14)})
    base = [node("trn2-0")]
    tolerating = request(
        "neurons", 4, tolerations=[{"key": "neuron.aws.com/hardware-error", "operator": "Exists"}]
    )
    snap = Snapshot.build(
        pods=[pod("p", "c"), pod("q", "t")],
        nodes=base,
        slices=tainted,
        claims=[claim("c", request("neurons", 4)), claim("t", tolerating)],
        classes=[NEURON_CLASS],
    )
    exp = explain_pod(snap, "default", "p")
    assert codes(exp, "trn2-0") == ["DeviceTainted"]
    assert "neuron.aws.com/hardware-error:NoSchedule" in exp.groups[0].reasons[0].message
    assert verdicts(explain_pod(snap, "default", "q")) == {"trn2-0": "fits"}
    older = msgspec.structs.replace(snap, server_version="v1.34.4")
    old_answer = explain_pod(older, "default", "p")
    assert verdicts(old_answer) == {"trn2-0": "fits"}
    assert "warning: the cluster runs Kubernetes v1.34.4" in render_text(old_answer)
    assert (
        "warning"
        not in explain_pod(
            msgspec.structs.replace(snap, server_version="v1.36.3"), "default", "p"
        ).observed
    )


def test_shared_counters_keep_the_node_device_and_its_chips_apart() -> None:
    whole_node = "device.attributes['neuron.aws.com'].resourceType == 'neuron_node'"
    snap = snapshot(
        {"trn2u-0": "trn2u.48xlarge"},
        claim("holder", request("neurons", 1), allocated_on="trn2u-0", devices=chips(7)),
        claim("c", request("node", 1, whole_node)),
        pod("p", "c"),
    )
    exp = explain_pod(snap, "default", "p")
    assert verdicts(exp) == {"trn2u-0": "does-not-fit"}
    assert "CounterSpent" in codes(exp, "trn2u-0")


def test_two_claims_that_fit_alone_conflict_together() -> None:
    snap = snapshot(
        {"trn2-0": "trn2.48xlarge"},
        claim("a", request("neurons", 12)),
        claim("b", request("neurons", 6)),
        pod("p", "a", "b"),
    )
    exp = explain_pod(snap, "default", "p")
    assert codes(exp, "trn2-0") == ["ClaimsConflict"]


def test_missing_attribute_is_a_scheduler_error_for_the_whole_pod() -> None:
    missing = "device.attributes['neuron.aws.com'].noSuchAttribute == 'x'"
    snap = snapshot(
        {"trn2-0": "trn2.48xlarge"}, claim("c", request("neurons", 1, missing)), pod("p", "c")
    )
    exp = explain_pod(snap, "default", "p")
    assert verdicts(exp) == {"trn2-0": "scheduler-error"}
    assert not exp.summary.schedulable
    assert exp.summary.blocked_by is not None
    assert exp.summary.blocked_by.message == (
        "claim default/c: selector #0: CEL runtime error: no such key: noSuchAttribute"
    )
    assert exp.top_code() == "SchedulerError"


def test_error_behind_a_solution_is_order_dependent() -> None:
    # deviceId 0 passes first; the others raise: the search finds a solution before an error.
    guarded = (
        "device.attributes['neuron.aws.com'].deviceId == 0 || "
        "device.attributes['neuron.aws.com'].noSuchAttribute == 'x'"
    )
    snap = snapshot(
        {"trn2-0": "trn2.48xlarge"}, claim("c", request("neurons", 1, guarded)), pod("p", "c")
    )
    exp = explain_pod(snap, "default", "p")
    assert verdicts(exp) == {"trn2-0": "fits"}
    assert "unless the scheduler reaches this error first" in exp.groups[0].reasons[0].message


def test_selector_explain_cannot_evaluate_makes_the_node_unknown() -> None:
    snap = snapshot(
        {"trn2-0": "trn2.48xlarge"},
        claim("c", request("neurons", 1, "'neuron.aws.com' in device.attributes")),
        pod("p", "c"),
    )
    exp = explain_pod(snap, "default", "p")
    assert verdicts(exp) == {"trn2-0": "unknown"}
    assert codes(exp, "trn2-0") == ["CannotEvaluate"]
    first_available = {
        "name": "r",
        "firstAvailable": [{"name": "a", "deviceClassName": "neuron.aws.com"}],
    }
    snap = snapshot({"trn2-0": "trn2.48xlarge"}, claim("c", first_available), pod("p", "c"))
    exp = explain_pod(snap, "default", "p")
    assert verdicts(exp) == {"trn2-0": "unknown"}
    assert "firstAvailable" in exp.groups[0].reasons[0].message


def test_node_filters_come_before_devices() -> None:
    snap = snapshot(
        {"trn2-0": "trn2.48xlarge", "inf2-0": "inf2.48xlarge"},
        claim("c", request("neurons", 1)),
        pod("p", "c", nodeSelector={"node.kubernetes.io/instance-type": "trn2.48xlarge"}),
        pod("q", "c"),
    )
    exp = explain_pod(snap, "default", "p")
    assert verdicts(exp) == {"inf2-0": "does-not-fit", "trn2-0": "fits"}
    assert codes(exp, "inf2-0") == ["NodeSelector"]
    cordoned = snapshot(
        {"trn2-0": "trn2.48xlarge"},
        claim("c", request("neurons", 1)),
        pod("p", "c"),
        unschedulable=True,
    )
    assert codes(explain_pod(cordoned, "default", "p"), "trn2-0") == ["NodeUnschedulable"]
    not_ready = snapshot(
        {"trn2-0": "trn2.48xlarge"},
        claim("c", request("neurons", 1)),
        pod("p", "c"),
        taints=[{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}],
    )
    assert codes(explain_pod(not_ready, "default", "p"), "trn2-0") == ["NodeNotReady"]


def test_no_pool_incomplete_pool_and_an_allocated_claim_elsewhere() -> None:
    snap = snapshot({"trn2-0": "trn2.48xlarge"}, claim("c", request("neurons", 1)), pod("p", "c"))
    bare = msgspec.structs.replace(snap, nodes=[*snap.nodes, node("cpu-0", "m5.large")])
    assert codes(explain_pod(bare, "default", "p"), "cpu-0") == ["NoPool"]
    half = [s for s in slices("trn2u-0", "trn2u.48xlarge") if "devices" in s["spec"]]
    partial = msgspec.structs.replace(snap, nodes=[node("trn2u-0", "trn2u.48xlarge")], slices=half)
    assert codes(explain_pod(partial, "default", "p"), "trn2u-0")[0] == "PoolIncomplete"
    shared = snapshot(
        {"trn2-0": "trn2.48xlarge", "trn2-1": "trn2.48xlarge"},
        claim("s", request("neurons", 1), allocated_on="trn2-0", devices=chips(0)),
        pod("p", "s"),
    )
    exp = explain_pod(shared, "default", "p")
    assert verdicts(exp) == {"trn2-0": "fits", "trn2-1": "does-not-fit"}
    assert codes(exp, "trn2-1") == ["ClaimOnOtherNode"]


def test_pod_level_reasons_leave_no_node_table() -> None:
    snap = snapshot(
        {"trn2-0": "trn2.48xlarge"},
        claim("c", {"name": "r", "exactly": {"deviceClassName": "nope", "count": 1}}),
        pod("p", "c"),
        pod("q", "gone"),
    )
    exp = explain_pod(snap, "default", "p")
    assert exp.nodes == {}
    assert exp.top_code() == "ClassMissing"
    assert exp.pod_level[0].message == "request r: device class nope does not exist"
    assert explain_pod(snap, "default", "q").top_code() == "ClaimMissing"


def test_nodes_with_the_same_reasons_share_a_group_and_the_signature_ignores_counts() -> None:
    nodes = {f"inf2-{i}": "inf2.48xlarge" for i in range(3)}
    one = snapshot(
        {**nodes, "trn2-0": "trn2.48xlarge"},
        claim("c", request("neurons", 16, TRN2)),
        pod("p", "c"),
    )
    exp = explain_pod(one, "default", "p")
    assert [len(g.nodes) for g in exp.groups] == [3, 1]
    held = snapshot(
        {**nodes, "trn2-0": "trn2.48xlarge"},
        claim("h", request("neurons", 1), allocated_on="trn2-0", devices=chips(0)),
        claim("c", request("neurons", 16, TRN2)),
        pod("p", "c"),
    )
    more_held = snapshot(
        {**nodes, "trn2-0": "trn2.48xlarge"},
        claim("h", request("neurons", 2), allocated_on="trn2-0", devices=chips(0, 1)),
        claim("c", request("neurons", 16, TRN2)),
        pod("p", "c"),
    )
    a, b = explain_pod(held, "default", "p"), explain_pod(more_held, "default", "p")
    assert a.signature() == b.signature() != exp.signature()


def test_event_message_stays_within_one_kib() -> None:
    nodes = {f"inf2-{i:03}": "inf2.48xlarge" for i in range(40)}
    long_selector = TRN2 + " && " + " && ".join(["true"] * 60)
    snap = snapshot(nodes, claim("c", request("neurons", 1, long_selector)), pod("p", "c"))
    message = explain_pod(snap, "default", "p").event_message()
    assert message.startswith("RequestSelector: ")
    assert len(message.encode()) <= 1024


def test_json_is_schema_v1() -> None:
    snap = snapshot({"trn2-0": "trn2.48xlarge"}, claim("c", request("neurons", 32)), pod("p", "c"))
    data: dict[str, Any] = msgspec.json.decode(to_json(explain_pod(snap, "default", "p")))
    assert data["apiVersion"] == "explain.neuron.aws.com/v1"
    assert data["kind"] == "Explanation"
    assert data["target"] == {"kind": "Pod", "namespace": "default", "name": "p"}
    assert data["summary"]["schedulable"] is False
    assert data["summary"]["doesNotFit"] == 1
    assert data["nodes"] == {"trn2-0": {"verdict": "does-not-fit", "group": 0}}
    assert data["groups"][0]["reasons"][0]["need"] == 32
    assert data["claims"][0]["requests"][0]["count"] == 32


def test_explain_claim_needs_no_pod() -> None:
    snap = snapshot(
        {"trn2-0": "trn2.48xlarge", "inf2-0": "inf2.48xlarge"},
        claim("c", request("neurons", 4, TRN2)),
    )
    exp = explain_claim(snap, "default", "c")
    assert exp.target.kind == "ResourceClaim"
    assert verdicts(exp) == {"inf2-0": "does-not-fit", "trn2-0": "fits"}


def test_workload_is_explained_through_its_first_pending_pod() -> None:
    workload = {
        "metadata": {"name": "train", "namespace": "default"},
        "status": {"resourceClaimTemplate": "train-rct"},
    }
    waiting = pod("train-0", "c")
    waiting["spec"]["resourceClaims"] = [
        {"name": "neurons", "resourceClaimTemplateName": "train-rct"}
    ]
    waiting["status"] = {"resourceClaimStatuses": [{"name": "neurons", "resourceClaimName": "c"}]}
    claim_obj = claim("c", request("neurons", 32))
    claim_obj["metadata"]["ownerReferences"] = [{"uid": "uid-train-0"}]
    base = snapshot({"trn2-0": "trn2.48xlarge"}, claim_obj, waiting)
    snap = msgspec.structs.replace(base, workloads=[workload])
    exp = explain_workload(snap, "default", "train")
    assert exp.target.kind == "NeuronUltraServerWorkload"
    assert exp.workload is not None
    assert (exp.workload["ultraServers"], exp.workload["pendingPods"]) == ([], ["train-0"])
    assert exp.top_code() == "NotEnoughDevices"
