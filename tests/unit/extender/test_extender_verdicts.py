"""The verdicts the extender keeps between calls: after any change to a node or to what its
pods hold, filter and prioritize answer exactly as if every verdict were worked out afresh."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st
from neuron_dra_scheduler_extender import ledger as ledger_module
from neuron_dra_scheduler_extender.api import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderFilterResult,
    HostPriority,
    NodeView,
)
from neuron_dra_scheduler_extender.decide import place, score, unfit, verdict
from neuron_dra_scheduler_extender.extender import Extender, decode_pod
from neuron_dra_scheduler_extender.inputs import CORE_RESOURCE, DEVICE_RESOURCE, Ask, shape_of
from neuron_dra_scheduler_extender.ledger import Allocation, Ledger, format_ids

from .helpers import FakeCluster, node_obj, pod, pod_obj, shape

#: Node name -> (instance type, cores per device it may report instead of the default).
FLEET = {
    "inf2-a": ("inf2.48xlarge", None),
    "inf2-b": ("inf2.48xlarge", None),
    "trn1-a": ("trn1.32xlarge", None),
    "trn2-a": ("trn2.48xlarge", 8),
    "inf1-a": ("inf1.6xlarge", None),
}
NAMES = [*FLEET, "not-a-node"]
RESOURCES = (DEVICE_RESOURCE, CORE_RESOURCE)

step = st.one_of(
    st.tuples(
        st.just("take"),
        st.sampled_from(sorted(FLEET)),
        st.sampled_from(RESOURCES),
        st.sampled_from((1, 2, 4, 8)),
    ),
    st.tuples(st.just("free"), st.integers(min_value=0, max_value=40)),
    # The node's view changes: reported cores per device flip (LNC), or it goes and comes.
    st.tuples(st.just("flip"), st.sampled_from(sorted(FLEET))),
    st.tuples(st.just("drop"), st.sampled_from(sorted(FLEET))),
    # Few kinds of request, so that most are asked again after a change; 3, 9 and 40 are
    # refused by some or all instance types.
    st.tuples(st.just("ask"), st.sampled_from(RESOURCES), st.sampled_from((1, 3, 4, 9, 40))),
)


def afresh(
    cluster: FakeCluster, ledger: Ledger, ask: Ask, names: list[str]
) -> tuple[ExtenderFilterResult, list[HostPriority]]:
    """filter and prioritize worked out from the decisions alone, nothing kept."""
    result = ExtenderFilterResult(node_names=[])
    scores = []
    for name in names:
        view = cluster.nodes.get(name)
        value = 0
        if view is None:
            result.failed_nodes[name] = "node(s) were not known to the Neuron extender yet"
        else:
            s = shape_of(view)
            used = ledger.used(s)
            why = unfit(s, ask, used)
            if why is None:
                assert result.node_names is not None
                result.node_names.append(name)
                value = score(s, ask, used)
            elif why.final:
                result.failed_and_unresolvable_nodes[name] = why.message
            else:
                result.failed_nodes[name] = why.message
        scores.append(HostPriority(host=name, score=value))
    return result, scores


@settings(max_examples=150, deadline=None)
@given(script=st.lists(step, max_size=60))
def test_kept_verdicts_equal_verdicts_worked_out_afresh(script: list[tuple[object, ...]]) -> None:
    cluster = FakeCluster([node_obj(n, t) for n, (t, _) in FLEET.items()])
    ext = Extender(cluster)
    held: list[str] = []
    flipped: set[str] = set()
    for number, (verb, *rest) in enumerate(script):
        if verb == "take":
            name, resource, count = rest
            assert isinstance(name, str)
            assert isinstance(resource, str)
            assert isinstance(count, int)
            view = cluster.nodes.get(name)
            if view is None:
                continue
            s = shape_of(view)
            ask = Ask(resource=resource, count=count)
            chosen = place(s, ask, ext.ledger.used(s))
            if chosen is None:
                continue
            ids = chosen.cores if ask.cores else chosen.devices
            uid = f"uid-{number}"
            annotations = {"AWS_NEURON_IDS": format_ids(ids), "NEURON_RESOURCE_TYPE": resource}
            ext.observe(
                pod(
                    f"p{number}",
                    uid=uid,
                    resource=resource,
                    count=count,
                    annotations=annotations,
                    node_name=name,
                    phase="Running",
                )
            )
            held.append(uid)
        elif verb == "free":
            (index,) = rest
            assert isinstance(index, int)
            if held:
                uid = held.pop(index % len(held))
                ext.observe(decode_pod({"metadata": {"uid": uid}}), deleted=True)
        elif verb in ("flip", "drop"):
            (name,) = rest
            assert isinstance(name, str)
            instance_type, other = FLEET[name]
            if verb == "drop" and name in cluster.nodes:
                del cluster.nodes[name]
                continue
            if verb == "flip":
                flipped ^= {name}
            obj = node_obj(name, instance_type, cores_per_device=other if name in flipped else None)
            cluster.nodes[name] = msgspec.convert(obj, NodeView)
        else:
            resource, count = rest
            assert isinstance(resource, str)
            assert isinstance(count, int)
            ask = Ask(resource=resource, count=count)
            asking = pod(f"ask{number}", resource=resource, count=count)
            expected_filter, expected_scores = afresh(cluster, ext.ledger, ask, NAMES)
            got = ext.filter(ExtenderArgs(pod=asking, node_names=NAMES))
            assert got == expected_filter
            assert ext.prioritize(ExtenderArgs(pod=asking, node_names=NAMES)) == expected_scores


INSTANCES = ("inf1.6xlarge", "inf2.48xlarge", "trn1.32xlarge", "trn2.48xlarge")


@settings(max_examples=300, deadline=None)
@given(
    instance=st.sampled_from(INSTANCES),
    used=st.sets(st.integers(min_value=0, max_value=127), max_size=128),
    resource=st.sampled_from(RESOURCES),
    count=st.integers(min_value=1, max_value=40),
)
def test_a_verdict_shared_by_nodes_in_one_state_names_each_node(
    instance: str, used: set[int], resource: str, count: int
) -> None:
    ask = Ask(resource=resource, count=count)
    for name in ("first", "second"):
        s = shape(instance, name=name)
        cores = {c for c in used if c < s.total_cores}
        assert verdict(s, ask, cores) == (unfit(s, ask, cores), score(s, ask, cores))


def test_the_ledger_names_the_nodes_changed_since_a_clock() -> None:
    led = Ledger()
    s = shape("trn2.48xlarge", name="a")
    led.record(Allocation(uid="u1", pod="ns/p1", node="a", cores=False, ids=(0,)))
    at = led.clock
    assert led.changed_since(at) == set()
    led.record(Allocation(uid="u2", pod="ns/p2", node="b", cores=False, ids=(1,)))
    led.release("u1")
    assert led.changed_since(at) == {"a", "b"}
    assert led.used(s) == frozenset()
    # The same allocation shown again by the watch is no change.
    led.record(Allocation(uid="u2", pod="ns/p2", node="b", cores=False, ids=(1,)))
    assert led.changed_since(led.clock) == set()


def test_changes_too_old_to_tell_make_every_node_changed() -> None:
    led = Ledger()
    for i in range(ledger_module._MAX_CHANGES + 2):
        led.record(Allocation(uid=f"u{i}", pod=f"ns/p{i}", node="a", cores=False, ids=(0,)))
    assert led.changed_since(0) is None
    assert led.changed_since(led.clock - 1) == {"a"}


async def test_a_node_filled_by_a_bind_is_refused_then_offered_again_once_freed() -> None:
    cluster = FakeCluster([node_obj("a", "trn1.32xlarge"), node_obj("b", "trn1.32xlarge")])
    ext = Extender(cluster)
    names = ["a", "b"]
    whole = pod_obj("whole", count=16)
    asked = ExtenderArgs(pod=pod("next", count=16), node_names=names)
    assert ext.filter(asked).node_names == ["a", "b"]
    cluster.add(whole)
    meta = whole["metadata"]
    bound = await ext.bind(
        ExtenderBindingArgs(
            pod_name=meta["name"], pod_namespace=meta["namespace"], pod_uid=meta["uid"], node="a"
        )
    )
    assert not bound.error
    after = ext.filter(asked)
    assert after.node_names == ["b"]
    assert after.failed_nodes == {"a": "node(s) had no 16 connected Neuron devices free"}
    ext.observe(decode_pod(whole), deleted=True)
    assert ext.filter(asked).node_names == ["a", "b"]
