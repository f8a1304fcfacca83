"""Seed 003's examples through the real kube-scheduler and the extender: connected devices in
the annotation AWS's device plugin reads, the refusal in the pod's condition, a restart that
forgets nothing, and two binds for the last set of which one wins."""

from __future__ import annotations

import json
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from neuron_dra_common.topology import connected_sets, instance_spec

from tests.integration.extender.conftest import NAMESPACE, NODES, ExtenderCluster

SEED_REFUSAL = (
    "Instance type trn1.32xlarge does not support requests for device: 7. "
    "Please request a different number of devices."
)


def neuron_pod(
    name: str,
    *,
    node: str,
    count: int,
    resource: str = "aws.amazon.com/neuron",
    scheduler: str = "default-scheduler",
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "schedulerName": scheduler,
            "restartPolicy": "Never",
            "nodeSelector": {"kubernetes.io/hostname": node},
            # Nodes without a kubelet keep the taints a node has until its kubelet reports.
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": "main",
                    "image": "public.ecr.aws/neuron/pytorch-inference-neuronx",
                    "resources": {
                        "limits": {"cpu": "4", "memory": "4Gi", resource: count},
                        "requests": {"cpu": "1", "memory": "1Gi"},
                    },
                }
            ],
        },
    }


def bound(cluster: ExtenderCluster, name: str) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def check() -> dict[str, Any] | None:
        pod = cluster.pod(name)
        seen["status"] = pod.get("status")
        return pod if pod["spec"].get("nodeName") else None

    try:
        found: dict[str, Any] = cluster.wait_for(f"pod {name} bound", check)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the pod's status: {seen.get('status')}") from None
    return found


def ids(pod: dict[str, Any]) -> str:
    value: str = pod["metadata"]["annotations"]["AWS_NEURON_IDS"]
    return value


def test_three_devices_on_inf2_are_a_ring_window_through_my_scheduler(
    extender_cluster: ExtenderCluster,
) -> None:
    extender_cluster.apply(neuron_pod("ring", node="inf2-ring", count=3, scheduler="my-scheduler"))
    pod = bound(extender_cluster, "ring")
    assert pod["spec"]["nodeName"] == "inf2-ring"
    annotations = pod["metadata"]["annotations"]
    assert annotations["AWS_NEURON_IDS"] == "0,1,2"
    assert annotations["NEURON_RESOURCE_TYPE"] == "aws.amazon.com/neuron"
    assert annotations["aws.amazon.com/predicate-node"] == "inf2-ring"
    assert annotations["NEURON_ALLOCATED"] == "false"


def test_seven_devices_on_trn1_stay_pending_with_the_seeds_text(
    extender_cluster: ExtenderCluster,
) -> None:
    extender_cluster.apply(neuron_pod("seven", node="trn1-rows", count=7))

    def refused() -> str:
        conditions = extender_cluster.pod("seven")["status"].get("conditions") or []
        for c in conditions:
            if c["type"] == "PodScheduled" and c["status"] == "False":
                return str(c.get("message", ""))
        return ""

    message = extender_cluster.wait_for("the pod's scheduling condition", refused)
    assert SEED_REFUSAL in message
    events = json.loads(
        extender_cluster.kubectl(
            "get",
            "events",
            "-n",
            NAMESPACE,
            "--field-selector",
            "involvedObject.name=seven,reason=FailedScheduling",
            "-o",
            "json",
        )
    )["items"]
    assert any(SEED_REFUSAL in e["message"] for e in events)
    assert not extender_cluster.pod("seven")["spec"].get("nodeName")


def test_nine_neuroncores_are_cores_0_to_8(extender_cluster: ExtenderCluster) -> None:
    # The seed's log: 9 neuroncores on a 4-core-per-device node -> "0,1,2,3,4,5,6,7,8".
    extender_cluster.apply(
        neuron_pod(
            "cores",
            node="inf1-cores",
            count=9,
            resource="aws.amazon.com/neuroncore",
            scheduler="my-scheduler",
        )
    )
    pod = bound(extender_cluster, "cores")
    assert ids(pod) == "0,1,2,3,4,5,6,7,8"
    assert pod["metadata"]["annotations"]["NEURON_RESOURCE_TYPE"] == "aws.amazon.com/neuroncore"


def test_four_devices_on_trn2_are_one_row_through_the_default_scheduler(
    extender_cluster: ExtenderCluster,
) -> None:
    extender_cluster.apply(neuron_pod("row", node="trn2-row", count=4))
    assert ids(bound(extender_cluster, "row")) == "0,1,2,3"


def test_a_restarted_extender_keeps_what_bound_pods_hold(
    extender_cluster: ExtenderCluster,
) -> None:
    extender_cluster.apply(neuron_pod("before", node="inf2-restart", count=3))
    assert ids(bound(extender_cluster, "before")) == "0,1,2"
    # SIGTERM ends the first process in order.
    assert extender_cluster.restart_extender() == 0
    log = (extender_cluster.root / "scheduler-extender.log").read_text()
    stopped = [json.loads(line) for line in log.splitlines() if '"service stopped"' in line]
    assert [s["exit_code"] for s in stopped] == [0]
    extender_cluster.apply(neuron_pod("after", node="inf2-restart", count=3))
    # Read back from the first pod's annotation: the next window, not 0-2 again.
    assert ids(bound(extender_cluster, "after")) == "3,4,5"


def test_a_pod_no_node_has_room_for_reads_one_count_per_reason(
    extender_cluster: ExtenderCluster,
) -> None:
    # Two trn2 nodes with 8 devices free each, but in two rows that are not one 8-device set:
    # the count fits, so kube-scheduler asks the extender, which refuses both nodes. The pod's
    # condition counts them under one reason, as the scheduler does for its own reasons,
    # instead of a line per node.
    frag = ("trn2-frag-0", "trn2-frag-1")
    holders = {n: [f"{n}-row{r}" for r in range(3)] for n in frag}
    for node, names in holders.items():
        for name in names:  # one at a time: rows 0, 1 and 2, packed
            extender_cluster.apply(neuron_pod(name, node=node, count=4))
            bound(extender_cluster, name)
        [middle] = [n for n in names if ids(extender_cluster.pod(n)) == "4,5,6,7"]
        # No kubelet runs there to finish a graceful deletion.
        extender_cluster.kubectl(
            "delete", "pod", "-n", NAMESPACE, middle, "--grace-period=0", "--force"
        )
    waiting = neuron_pod("eight", node=frag[0], count=8)
    waiting["spec"].pop("nodeSelector")
    waiting["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "kubernetes.io/hostname", "operator": "In", "values": frag}
                        ]
                    }
                ]
            }
        }
    }

    def refused() -> str:
        for c in extender_cluster.pod("eight")["status"].get("conditions") or []:
            if c["type"] == "PodScheduled" and c["status"] == "False":
                message = str(c.get("message", ""))
                # Until the extender saw the deletions, the nodes read as full.
                if "2 node(s) had no 8 connected Neuron devices free" in message:
                    return message
        return ""

    extender_cluster.apply(waiting)
    message = extender_cluster.wait_for("the pod's scheduling condition", refused)
    assert message.startswith(f"0/{len(NODES)} nodes are available: "), message
    assert "trn2-frag" not in message, message
    assert not extender_cluster.pod("eight")["spec"].get("nodeName")


def _bind(cluster: ExtenderCluster, name: str, uid: str, node: str) -> dict[str, Any]:
    args = {"PodName": name, "PodNamespace": NAMESPACE, "PodUID": uid, "Node": node}
    return cluster.call("bind", args)


def _filter(cluster: ExtenderCluster, pod: dict[str, Any], node: str) -> dict[str, Any]:
    # As kube-scheduler calls the `my-scheduler` profile's extender: the Pod and node names.
    return cluster.call("filter", {"Pod": pod, "NodeNames": [node]})


def test_two_binds_racing_for_the_last_set_never_both_win(
    extender_cluster: ExtenderCluster,
) -> None:
    # No scheduler takes these pods: the binds below are the scheduler's calls, at once.
    names = ("holder", "racer-a", "racer-b")
    extender_cluster.apply(
        *(neuron_pod(n, node="trn2-race", count=8, scheduler="nobody") for n in names)
    )
    uids = {n: extender_cluster.pod(n)["metadata"]["uid"] for n in names}
    assert _bind(extender_cluster, "holder", uids["holder"], "trn2-race") == {"Error": ""}
    assert ids(bound(extender_cluster, "holder")) == "0,1,2,3,4,5,6,7"
    with ThreadPoolExecutor(max_workers=2) as pool:
        answers = dict(
            zip(
                ("racer-a", "racer-b"),
                pool.map(
                    lambda n: _bind(extender_cluster, n, uids[n], "trn2-race"),
                    ("racer-a", "racer-b"),
                ),
                strict=True,
            )
        )
    winners = [n for n, a in answers.items() if not a["Error"]]
    assert len(winners) == 1, answers
    [loser] = [n for n in answers if n not in winners]
    assert (
        "node trn2-race has no 8 connected Neuron devices free (0 of 16 devices free)"
        in answers[loser]["Error"]
    )
    assert ids(bound(extender_cluster, winners[0])) == "8,9,10,11,12,13,14,15"
    lost = extender_cluster.pod(loser)
    assert not lost["spec"].get("nodeName")
    assert "AWS_NEURON_IDS" not in (lost["metadata"].get("annotations") or {})


def test_a_bind_takes_another_free_set_when_the_one_seen_at_filter_time_is_gone(
    extender_cluster: ExtenderCluster,
) -> None:
    # The scheduler's order when it places pods one after the other: each pod is filtered
    # before the bind of the one before it has reached the extender, so both saw the same
    # empty node and the same best row.
    names = ("early", "late")
    extender_cluster.apply(
        *(neuron_pod(n, node="trn2-stale", count=4, scheduler="nobody") for n in names)
    )
    pods = {n: extender_cluster.pod(n) for n in names}
    for n in names:
        assert _filter(extender_cluster, pods[n], "trn2-stale")["NodeNames"] == ["trn2-stale"]
    for n in names:
        assert _bind(extender_cluster, n, pods[n]["metadata"]["uid"], "trn2-stale") == {"Error": ""}
    rows = {",".join(map(str, s)) for s in connected_sets(instance_spec("trn2.48xlarge"), 4)}
    got = {n: ids(bound(extender_cluster, n)) for n in names}
    assert got["early"] in rows
    assert got["late"] in rows
    assert got["early"] != got["late"]


def test_pods_filtered_together_racing_for_the_last_set_never_both_win(
    extender_cluster: ExtenderCluster,
) -> None:
    # As the race above, but through the scheduler's own order: filter, then bind; both racers
    # were offered the node while its last 8 devices were free.
    names = ("last-holder", "last-a", "last-b")
    extender_cluster.apply(
        *(neuron_pod(n, node="trn2-last", count=8, scheduler="nobody") for n in names)
    )
    pods = {n: extender_cluster.pod(n) for n in names}
    uids = {n: p["metadata"]["uid"] for n, p in pods.items()}
    assert _filter(extender_cluster, pods["last-holder"], "trn2-last")["NodeNames"] == ["trn2-last"]
    assert _bind(extender_cluster, "last-holder", uids["last-holder"], "trn2-last") == {"Error": ""}
    assert ids(bound(extender_cluster, "last-holder")) == "0,1,2,3,4,5,6,7"
    for n in ("last-a", "last-b"):
        assert _filter(extender_cluster, pods[n], "trn2-last")["NodeNames"] == ["trn2-last"]
    with ThreadPoolExecutor(max_workers=2) as pool:
        answers = dict(
            zip(
                ("last-a", "last-b"),
                pool.map(
                    lambda n: _bind(extender_cluster, n, uids[n], "trn2-last"), ("last-a", "last-b")
                ),
                strict=True,
            )
        )
    winners = [n for n, a in answers.items() if not a["Error"]]
    assert len(winners) == 1, answers
    [loser] = [n for n in answers if n not in winners]
    assert (
        "node trn2-last has no 8 connected Neuron devices free (0 of 16 devices free)"
        in answers[loser]["Error"]
    )
    assert ids(bound(extender_cluster, winners[0])) == "8,9,10,11,12,13,14,15"
    lost = extender_cluster.pod(loser)
    assert not lost["spec"].get("nodeName")
    assert "AWS_NEURON_IDS" not in (lost["metadata"].get("annotations") or {})
    # Filtered again, the loser is told the node is full, in words.
    again = _filter(extender_cluster, lost, "trn2-last")
    assert again["NodeNames"] == []
    assert again["FailedNodes"] == {"trn2-last": "node(s) had no 8 connected Neuron devices free"}


def test_a_verb_body_past_its_limit_is_refused_before_it_is_read(
    extender_cluster: ExtenderCluster,
) -> None:
    # The extender reads at most what a scheduler with nodeCacheCapable: true sends (4 MiB):
    # a larger body is answered 413 on its announced length alone.
    port = extender_cluster.extender_port
    context = extender_cluster.client_context()
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as conn,
    ):
        conn.sendall(
            b"POST /filter HTTP/1.1\r\nHost: extender\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (10 * 2**20)
        )
        answer = conn.recv(65536)
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    # The extender goes on answering the scheduler.
    got = extender_cluster.call("filter", {"Pod": {"metadata": {"name": "p"}}, "NodeNames": []})
    assert got["NodeNames"] == []
