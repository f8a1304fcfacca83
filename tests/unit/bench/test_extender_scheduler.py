"""The ``extender`` benchmark's run through kube-scheduler, without a control plane: the
scheduler configurations it writes from the component's files, the objects it creates, when it
counts a pod bound, its pods/s and the report it prints."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from neuron_dra_scheduler_extender.api import (
    ExtenderArgs,
    ExtenderBindingArgs,
    NodeView,
)
from neuron_dra_scheduler_extender.extender import Extender, decode_pod

from bench.noop_extender import answer_filter, answer_prioritize, binding
from bench.scenarios.extender import SCHEDULED, SCHEDULED_QUICK, _fleet, _Memory, _script
from bench.scenarios.extender_scheduler import (
    ALONE,
    CLIENT_QPS,
    NOOP,
    NOOP_RUN,
    OURS,
    RUNS,
    WITH_EXTENDER,
    Binds,
    Outcome,
    combine,
    drain_rate,
    node_object,
    pod_object,
    refused_binds,
    report,
    scheduler_config,
)

Obj = dict[str, Any]
KUBECONFIG = Path("/tmp/sched.kubeconfig")


def source(run_name: str) -> Obj:
    [run] = [r for r in RUNS if r.name == run_name]
    loaded: Obj = yaml.safe_load(run.source.read_text())
    return loaded


def test_the_run_alone_is_the_default_scheduler_configuration_without_its_extender() -> None:
    original = source("kube-scheduler alone")
    config = scheduler_config(original, extender_url=None, kubeconfig=KUBECONFIG)
    assert "extenders" not in config
    assert "extenders" in original  # the component's file, as read, is left alone
    assert config["clientConnection"] == {
        "kubeconfig": str(KUBECONFIG),
        "qps": CLIENT_QPS,
        "burst": CLIENT_QPS,
    }
    assert config["leaderElection"] == {"leaderElect": False}


@pytest.mark.parametrize(
    ("run_name", "profile", "node_cache"),
    [
        ("node names", "my-scheduler", True),
        ("default scheduler", None, True),
        ("full Nodes", None, False),
        ("no-op extender", "my-scheduler", True),
    ],
)
def test_runs_with_the_extender_call_this_extender_as_the_component_configures_it(
    run_name: str, profile: str | None, node_cache: bool
) -> None:
    [run] = [r for r in RUNS if r.name == run_name]
    config = scheduler_config(
        source(run_name),
        extender_url="http://127.0.0.1:4242",
        kubeconfig=KUBECONFIG,
        node_cache=run.node_cache,
    )
    # Only the full Nodes run changes the component's configuration.
    assert run.shipped is (run_name != "full Nodes")
    [extender] = config["extenders"]
    assert extender["urlPrefix"] == "http://127.0.0.1:4242"
    assert extender["nodeCacheCapable"] is node_cache
    assert extender["bindVerb"] == "bind"
    assert extender["ignorable"] is False
    assert [p["schedulerName"] for p in config.get("profiles") or []] == (
        [profile] if profile else []
    )
    assert config["leaderElection"] == {"leaderElect": False}


def test_the_no_op_extender_is_called_exactly_as_ours_is_with_node_names() -> None:
    # Same configuration file, same profile: only the process behind the URL differs.
    assert (NOOP_RUN.source, NOOP_RUN.profile) == (
        WITH_EXTENDER[0].source,
        WITH_EXTENDER[0].profile,
    )
    assert (NOOP_RUN.extender, WITH_EXTENDER[0].extender, ALONE.extender) == (NOOP, OURS, "")
    # Interleaved: the scheduler alone first, then each kind of extender.
    assert [r.name for r in RUNS] == [
        "kube-scheduler alone",
        "no-op extender",
        "node names",
        "default scheduler",
        "full Nodes",
    ]


def test_the_no_op_extender_keeps_every_node_scores_none_and_binds_what_it_is_told() -> None:
    names = {"Pod": {"metadata": {"name": "p"}}, "NodeNames": ["a", "b", "c"]}
    assert answer_filter(names)["NodeNames"] == ["a", "b", "c"]
    assert answer_filter(names)["FailedNodes"] == {}
    nodes = {"Pod": {}, "Nodes": {"items": [node_object("a", "trn2.48xlarge")]}}
    assert answer_filter(nodes)["Nodes"] == nodes["Nodes"]
    assert answer_prioritize(names) == [{"Host": n, "Score": 0} for n in "abc"]
    assert answer_prioritize(nodes) == [{"Host": "a", "Score": 0}]
    made = binding({"PodName": "p", "PodNamespace": "ns", "PodUID": "u1", "Node": "a"})
    assert made["metadata"] == {"name": "p", "namespace": "ns", "uid": "u1"}
    assert made["target"]["name"] == "a"
    assert "annotations" not in made["metadata"]


def test_each_run_names_the_profile_its_configuration_serves() -> None:
    for run in RUNS:
        profiles = [p["schedulerName"] for p in source(run.name).get("profiles") or []]
        assert run.profile in (profiles or ["default-scheduler"])


def test_the_extender_reads_the_nodes_and_pods_the_run_creates() -> None:
    # 3 devices: a ring window on inf2, a count trn1's torus refuses with AWS's words.
    nodes = {
        "inf2": msgspec.convert(node_object("inf2", "inf2.48xlarge"), NodeView),
        "trn1": msgspec.convert(node_object("trn1", "trn1.32xlarge"), NodeView),
    }
    pod = pod_object("p", resource="aws.amazon.com/neuron", count=3, scheduler="my-scheduler")
    assert pod["spec"]["schedulerName"] == "my-scheduler"
    result = Extender(_Memory(nodes)).filter(
        ExtenderArgs(pod=decode_pod(pod), node_names=["inf2", "trn1"])
    )
    assert result.node_names == ["inf2"]
    assert "does not support requests for device: 3" in (
        (result.failed_and_unresolvable_nodes or {}).get("trn1", "")
    )


async def _placed(nodes: int) -> int:
    fleet = _fleet(nodes)
    views = {name: msgspec.convert(node_object(name, t), NodeView) for name, t in fleet}
    cluster = _Memory(views)
    extender = Extender(cluster)
    placed = 0
    for i, (resource, count) in enumerate(_script(nodes, seed=1)):
        pod = pod_object(f"p{i}", resource=resource, count=count, scheduler="my-scheduler")
        pod["metadata"]["uid"] = f"u{i}"
        cluster.pods[f"bench-scheduling/p{i}"] = pod
        fits = extender.filter(ExtenderArgs(pod=decode_pod(pod), node_names=list(views)))
        if not fits.node_names:
            continue
        answer = await extender.bind(
            ExtenderBindingArgs(
                pod_name=f"p{i}",
                pod_namespace="bench-scheduling",
                pod_uid=f"u{i}",
                node=fits.node_names[0],
            )
        )
        placed += not answer.error
    return placed


@pytest.mark.parametrize("size", [SCHEDULED_QUICK, SCHEDULED])
def test_as_many_pods_as_nodes_all_find_connected_devices(size: int) -> None:
    # Otherwise a run with the extender would never see all its pods bound.
    assert asyncio.run(_placed(size)) == size


def bound(name: str, node: str = "node-1") -> Obj:
    return {"type": "MODIFIED", "object": {"metadata": {"name": name}, "spec": {"nodeName": node}}}


def pending(name: str, message: str = "") -> Obj:
    conditions = [{"type": "PodScheduled", "status": "False", "message": message}]
    return {
        "type": "ADDED",
        "object": {"metadata": {"name": name}, "spec": {}, "status": {"conditions": conditions}},
    }


def test_a_pod_counts_bound_when_first_seen_with_a_node() -> None:
    binds = Binds(["a", "b"])
    assert not binds.saw(pending("a"), at=1.0)
    assert not binds.saw(bound("a"), at=2.0)
    # A later version of a bound pod (its annotations, its status) keeps the first time.
    assert not binds.saw(bound("a"), at=3.0)
    # Pods of no interest and deletions change nothing.
    assert not binds.saw(bound("other"), at=3.5)
    assert not binds.saw({"type": "DELETED", "object": bound("b")["object"]}, at=3.6)
    assert binds.saw(bound("b"), at=4.0)
    assert binds.at == {"a": 2.0, "b": 4.0}


def test_pods_left_unbound_are_counted_with_the_schedulers_reason() -> None:
    binds = Binds(["a", "b", "c"])
    binds.saw(bound("a"), at=1.0)
    binds.saw(
        pending("b", "0/200 nodes are available: 200 Insufficient aws.amazon.com/neuron."), at=1.5
    )
    assert binds.unbound() == (
        "2 of 3 pods not bound; the scheduler says: "
        "0/200 nodes are available: 200 Insufficient aws.amazon.com/neuron."
    )
    assert Binds(["x"]).unbound() == "1 of 1 pods not bound"


def test_pods_per_second_runs_from_the_first_bind_to_the_last() -> None:
    assert drain_rate([12.0, 10.0, 10.5, 11.0]) == 1.5
    with pytest.raises(ValueError, match=r"binds at two different times, got \[1.0\]"):
        drain_rate([1.0])


def test_refused_binds_are_read_from_the_extenders_metrics() -> None:
    metrics = "\n".join(
        [
            "# HELP neuron_dra_extender_decisions_total Extender answers by verb and outcome",
            "# TYPE neuron_dra_extender_decisions_total counter",
            'neuron_dra_extender_decisions_total{outcome="fit",verb="filter"} 240.0',
            'neuron_dra_extender_decisions_total{outcome="bound",verb="bind"} 200.0',
            'neuron_dra_extender_decisions_total{outcome="error",verb="bind"} 17.0',
        ]
    )
    assert refused_binds(metrics) == 17
    assert refused_binds(metrics.replace('outcome="error"', 'outcome="bound"')) == 0


def test_the_rounds_of_a_run_make_one_outcome_whose_rate_is_their_median() -> None:
    outcome = combine(
        [
            Outcome(rates=(90.0,), refused=1),
            Outcome(rates=(150.0,)),
            Outcome(rates=(120.0,), refused=2),
        ]
    )
    assert outcome.rates == (90.0, 150.0, 120.0)
    assert outcome.rate == 120.0
    assert outcome.refused == 3


def test_the_report_sets_each_run_with_the_extender_against_the_scheduler_alone() -> None:
    figures, notes = report(
        {
            "kube-scheduler alone": Outcome(rates=(190.0, 200.0, 260.0)),
            "no-op extender": Outcome(rates=(150.0, 140.0, 160.0)),
            "node names": Outcome(rates=(120.0, 100.0, 121.0), refused=3),
            "default scheduler": Outcome(rates=(90.0, 95.0, 99.0), refused=0),
            "full Nodes": Outcome(rates=(80.0, 80.0, 80.0), refused=0),
        },
        nodes=200,
        pods=200,
    )
    assert [(f.name, f.value, f.baseline, f.baseline_name, f.ratio) for f in figures] == [
        (
            "scheduler pods/s with the extender, node names (200 nodes, 200 pods)",
            120.0,
            200.0,
            "kube-scheduler alone",
            0.6,
        ),
        (
            "scheduler pods/s with the extender, default scheduler (200 nodes, 200 pods)",
            95.0,
            200.0,
            "kube-scheduler alone",
            0.475,
        ),
        (
            "scheduler pods/s with the extender, full Nodes (200 nodes, 200 pods)",
            80.0,
            200.0,
            "kube-scheduler alone",
            0.4,
        ),
        (
            "scheduler pods/s with the extender, node names, against a no-op extender",
            120.0,
            150.0,
            "no-op extender",
            0.8,
        ),
    ]
    assert notes[-2] == (
        "goal: scheduler throughput with the extender >= 0.5x without it, with the "
        "component's configurations: 0.60x with node names: met, 0.47x with default "
        "scheduler: NOT met"
    )
    assert notes[-1] == (
        "with a configuration that sends whole Nodes (nodeCacheCapable: false, not the "
        "component's): 0.40x with full Nodes"
    )
    assert "3 (node names), 0 (default scheduler), 0 (full Nodes)" in notes[-3]
    assert notes[0].startswith("scheduler pods/s: 200 nodes, 200 pods;")
    assert notes[0].endswith("median of 3 interleaved rounds")
    assert notes[1] == (
        "pods/s of each round: kube-scheduler alone 190.0 / 200.0 / 260.0; "
        "no-op extender 150.0 / 140.0 / 160.0; node names 120.0 / 100.0 / 121.0; "
        "default scheduler 90.0 / 95.0 / 99.0; full Nodes 80.0 / 80.0 / 80.0"
    )
    assert "reaches 0.75x the scheduler alone" in notes[2]
