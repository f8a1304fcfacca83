"""The extender's verbs over a fake cluster: filter, prioritize, bind, races and restarts."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from neuron_dra_scheduler_extender.api import (
    ExtenderBindingArgs,
    PodView,
    decode_args,
    encode,
)
from neuron_dra_scheduler_extender.extender import Extender, decode_pod
from neuron_dra_scheduler_extender.verbs import routes

from .helpers import FakeCluster, node_obj, pod_obj


def args(pod: dict[str, Any], nodes: list[dict[str, Any]], *, names: bool) -> bytes:
    if names:
        return encode({"Pod": pod, "NodeNames": [n["metadata"]["name"] for n in nodes]})
    return encode({"Pod": pod, "Nodes": {"items": nodes}})


def binding(pod: dict[str, Any], node: str) -> ExtenderBindingArgs:
    meta = pod["metadata"]
    return ExtenderBindingArgs(
        pod_name=meta["name"], pod_namespace=meta["namespace"], pod_uid=meta["uid"], node=node
    )


NODES = [node_obj("inf2-0", "inf2.48xlarge"), node_obj("trn1-0", "trn1.32xlarge")]


async def test_filter_answers_in_the_form_it_was_asked() -> None:
    ext = Extender(FakeCluster(NODES))
    p = pod_obj("seven", count=7)
    handlers = routes(ext, ready=lambda: True)
    for names in (True, False):
        status, body = await handlers["/filter"](args(p, NODES, names=names))
        assert status == 200
        got = msgspec.json.decode(body)
        message = (
            "Instance type trn1.32xlarge does not support requests for device: 7. "
            "Please request a different number of devices."
        )
        assert got["FailedAndUnresolvableNodes"] == {"trn1-0": message}
        if names:
            assert got["NodeNames"] == ["inf2-0"]
        else:
            # The scheduler takes back the Node objects it sent, unchanged.
            assert got["Nodes"]["items"] == [NODES[0]]


async def test_prioritize_scores_the_fuller_node_higher() -> None:
    nodes = [node_obj("a", "trn2.48xlarge"), node_obj("b", "trn2.48xlarge")]
    cluster = FakeCluster(nodes)
    ext = Extender(cluster)
    first = cluster.add(pod_obj("first", count=8))
    assert not (await ext.bind(binding(cluster.pods["default/first"], "a"))).error
    ext.observe(decode_pod(cluster.pods["default/first"]))
    assert first.metadata.uid in {a.uid for a in ext.ledger.on_node("a")}
    scores = ext.prioritize(decode_args(args(pod_obj("next", count=4), nodes, names=True)))
    by_host = {h.host: h.score for h in scores}
    assert by_host["a"] > by_host["b"]


async def test_two_binds_racing_for_the_last_set_never_both_win() -> None:
    cluster = FakeCluster([node_obj("trn2-0", "trn2.48xlarge")])
    ext = Extender(cluster)
    holder = cluster.add(
        pod_obj(
            "holder",
            count=8,
            annotations={
                "AWS_NEURON_IDS": "0,1,2,3,4,5,6,7",
                "NEURON_RESOURCE_TYPE": "aws.amazon.com/neuron",
            },
            node_name="trn2-0",
            phase="Running",
        )
    )
    ext.observe(holder)
    a, b = pod_obj("a", count=8), pod_obj("b", count=8)
    cluster.add(a)
    cluster.add(b)
    cluster.gate.clear()
    racing = [asyncio.create_task(ext.bind(binding(p, "trn2-0"))) for p in (a, b)]
    await asyncio.sleep(0.01)
    cluster.gate.set()
    results = await asyncio.gather(*racing)
    errors = [r.error for r in results if r.error]
    assert len(errors) == 1, results
    assert "has no 8 connected Neuron devices free (0 of 16 devices free)" in errors[0]
    assert list(cluster.bound.values()) == ["trn2-0"]
    winner = next(k for k in cluster.bound)
    assert cluster.pods[winner]["metadata"]["annotations"]["AWS_NEURON_IDS"] == (
        "8,9,10,11,12,13,14,15"
    )


async def test_a_restarted_extender_rebuilds_from_annotations() -> None:
    cluster = FakeCluster([node_obj("inf2-0", "inf2.48xlarge")])
    first = Extender(cluster)
    p = pod_obj("three", count=3)
    cluster.add(p)
    assert not (await first.bind(binding(p, "inf2-0"))).error
    assert cluster.pods["default/three"]["metadata"]["annotations"]["AWS_NEURON_IDS"] == "0,1,2"
    # A new process: it knows only what the pods say.
    second = Extender(cluster)
    for obj in cluster.pods.values():
        second.observe(decode_pod(obj))
    q = pod_obj("next", count=3)
    cluster.add(q)
    assert not (await second.bind(binding(q, "inf2-0"))).error
    assert cluster.pods["default/next"]["metadata"]["annotations"]["AWS_NEURON_IDS"] == "3,4,5"


async def test_a_failed_binding_frees_the_reservation() -> None:
    cluster = FakeCluster([node_obj("trn2-0", "trn2.48xlarge")])
    ext = Extender(cluster)
    p = pod_obj("whole", count=16)
    cluster.add(p)
    cluster.fail_bind = True
    result = await ext.bind(binding(p, "trn2-0"))
    assert result.error == ("Pod default/whole on node trn2-0: the apiserver refused the binding")
    assert len(ext.ledger) == 0
    cluster.fail_bind = False
    assert not (await ext.bind(binding(p, "trn2-0"))).error


async def test_an_older_view_of_a_pod_does_not_free_its_fresh_reservation() -> None:
    cluster = FakeCluster([node_obj("trn2-0", "trn2.48xlarge")])
    ext = Extender(cluster)
    p = pod_obj("row", count=4)
    stale = cluster.add(p)
    assert not (await ext.bind(binding(p, "trn2-0"))).error
    ext.observe(stale)  # the watch still shows the pod before its annotation
    assert len(ext.ledger) == 1
    ext.observe(decode_pod(cluster.pods["default/row"]), deleted=True)
    assert len(ext.ledger) == 0


async def test_verbs_refuse_to_decide_before_the_pods_are_read() -> None:
    handlers = routes(Extender(FakeCluster(NODES)), ready=lambda: False)
    status, body = await handlers["/filter"](args(pod_obj("p"), NODES, names=True))
    assert status == 200
    assert "has not read the cluster's pods yet" in msgspec.json.decode(body)["Error"]
    status, body = await handlers["/bind"](b"{not json")
    assert status == 200  # still starting: nothing is decoded yet


def holding(cluster: FakeCluster, node: str, count: int) -> PodView:
    """A running pod that holds the first ``count`` devices of ``node``."""
    return cluster.add(
        pod_obj(
            "holder",
            count=count,
            annotations={
                "AWS_NEURON_IDS": ",".join(str(d) for d in range(count)),
                "NEURON_RESOURCE_TYPE": "aws.amazon.com/neuron",
            },
            node_name=node,
            phase="Running",
        )
    )


async def test_a_filter_after_a_bind_has_arrived_sees_its_devices_taken() -> None:
    # The bind's API call is still on its way (the gate is closed): the devices are already
    # the bound pod's, and the next pod is told the node is full.
    nodes = [node_obj("trn2-0", "trn2.48xlarge")]
    cluster = FakeCluster(nodes)
    ext = Extender(cluster)
    ext.observe(holding(cluster, "trn2-0", 8))
    handlers = routes(ext, ready=lambda: True)
    first, second = cluster.add(pod_obj("first", count=8)), pod_obj("second", count=8)
    cluster.add(second)
    _, body = await handlers["/filter"](args(cluster.pods["default/first"], nodes, names=True))
    assert msgspec.json.decode(body)["NodeNames"] == ["trn2-0"]
    cluster.gate.clear()
    binding_first = asyncio.create_task(ext.bind(binding(cluster.pods["default/first"], "trn2-0")))
    await asyncio.sleep(0)
    _, body = await handlers["/filter"](args(second, nodes, names=True))
    got = msgspec.json.decode(body)
    assert got["NodeNames"] == []
    assert got["FailedNodes"] == {"trn2-0": "node(s) had no 8 connected Neuron devices free"}
    cluster.gate.set()
    assert not (await binding_first).error
    assert cluster.bound == {first.key: "trn2-0"}


async def test_a_filter_waits_for_the_bind_due_from_the_filter_before_it() -> None:
    # kube-scheduler filters the next pod before the previous pod's bind has arrived: the
    # next filter answers once that bind has taken its devices, not on the picture before.
    nodes = [node_obj("trn2-0", "trn2.48xlarge")]
    cluster = FakeCluster(nodes)
    ext = Extender(cluster, bind_grace=30.0)
    ext.observe(holding(cluster, "trn2-0", 8))
    handlers = routes(ext, ready=lambda: True)
    cluster.add(pod_obj("first", count=8))
    second = pod_obj("second", count=8)
    cluster.add(second)
    await handlers["/filter"](args(cluster.pods["default/first"], nodes, names=True))
    filtering = asyncio.ensure_future(handlers["/filter"](args(second, nodes, names=True)))
    await asyncio.sleep(0.05)
    assert not filtering.done()
    assert not (await ext.bind(binding(cluster.pods["default/first"], "trn2-0"))).error
    _, body = await asyncio.wait_for(filtering, 5)
    assert msgspec.json.decode(body)["NodeNames"] == []


async def test_a_bind_that_never_comes_holds_the_next_filter_for_the_grace_only() -> None:
    # The scheduler gave the first pod up after its filter (another plugin refused it).
    nodes = [node_obj("trn2-0", "trn2.48xlarge")]
    cluster = FakeCluster(nodes)
    ext = Extender(cluster, bind_grace=0.2)
    handlers = routes(ext, ready=lambda: True)
    await handlers["/filter"](args(pod_obj("given-up", count=8), nodes, names=True))
    loop = asyncio.get_running_loop()
    started = loop.time()
    _, body = await asyncio.wait_for(
        handlers["/filter"](args(pod_obj("next", count=8), nodes, names=True)), 5
    )
    assert loop.time() - started >= 0.15
    assert msgspec.json.decode(body)["NodeNames"] == ["trn2-0"]
    # The pod given up and filtered again waits for nobody: its own bind is not due.
    started = loop.time()
    await handlers["/filter"](args(pod_obj("next", count=8), nodes, names=True))
    assert loop.time() - started < 0.15


async def test_a_bind_tried_again_for_a_bound_pod_keeps_its_devices() -> None:
    # The answer to the first bind was lost; the API refuses the second (the pod is bound):
    # the devices stay the pod's.
    cluster = FakeCluster([node_obj("trn2-0", "trn2.48xlarge")])
    ext = Extender(cluster)
    p = pod_obj("row", count=4)
    cluster.add(p)
    assert not (await ext.bind(binding(p, "trn2-0"))).error
    ext.observe(decode_pod(cluster.pods["default/row"]))
    again = await ext.bind(binding(p, "trn2-0"))
    assert "already assigned to node trn2-0" in again.error
    held = ext.ledger.get("uid-row")
    assert held is not None
    assert held.ids == (0, 1, 2, 3)


async def test_a_body_that_is_not_utf8_json_is_a_bad_request() -> None:
    handlers = routes(Extender(FakeCluster(NODES)), ready=lambda: True)
    for verb in ("/filter", "/prioritize", "/bind"):
        status, body = await handlers[verb](b'{"Pod": {"metadata": {"name": "\xa9"}}}')
        assert status == 400, verb
        assert "the request body is not extender v1 JSON" in msgspec.json.decode(body)["Error"]


async def test_a_pod_asking_for_no_neuron_resource_is_neither_offered_a_node_nor_bound() -> None:
    cluster = FakeCluster(NODES)
    ext = Extender(cluster)
    plain = pod_obj("plain", count=0)
    cluster.add(plain)
    handlers = routes(ext, ready=lambda: True)
    status, body = await handlers["/filter"](args(plain, NODES, names=True))
    got = msgspec.json.decode(body)
    assert status == 200
    assert got["NodeNames"] == []
    reason = got["FailedAndUnresolvableNodes"]["inf2-0"]
    assert reason.startswith("node(s) were not offered: the pod asks for no aws.amazon.com/neuron")
    assert set(got["FailedAndUnresolvableNodes"]) == {"inf2-0", "trn1-0"}

    result = await ext.bind(binding(plain, "inf2-0"))
    assert result.error == (
        "Pod default/plain not bound to node inf2-0: the pod asks for no aws.amazon.com/neuron, "
        "aws.amazon.com/neurondevice or aws.amazon.com/neuroncore, and the Neuron extender "
        "places and binds only pods that do"
    )
    assert cluster.bound == {}
    assert cluster.pods["default/plain"]["spec"]["nodeName"] == ""
