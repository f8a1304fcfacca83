"""The pod annotations the device plugin reads, and the ledger rebuilt from them."""

from __future__ import annotations

import pytest
from neuron_dra_scheduler_extender.inputs import CORE_RESOURCE, Ask, AskError, ask_of
from neuron_dra_scheduler_extender.ledger import (
    Allocation,
    Conflict,
    Ledger,
    allocation_of,
    annotations_for,
)

from .helpers import pod, shape


def test_annotations_name_the_ids_resource_and_node() -> None:
    got = annotations_for(
        ask=Ask(resource=CORE_RESOURCE, count=9), ids=range(9), node="inf1-0", now_ns=5
    )
    assert got == {
        "AWS_NEURON_IDS": "0,1,2,3,4,5,6,7,8",
        "NEURON_RESOURCE_TYPE": "aws.amazon.com/neuroncore",
        "NEURON_ALLOC_TIME": "5",
        "NEURON_ALLOCATED": "false",
        "aws.amazon.com/predicate-node": "inf1-0",
    }


def test_a_bound_pod_is_read_back_and_a_finished_one_holds_nothing() -> None:
    annotations = {"AWS_NEURON_IDS": "4,5,6,7", "NEURON_RESOURCE_TYPE": "aws.amazon.com/neuron"}
    running = pod("a", count=4, annotations=annotations, node_name="trn2-0", phase="Running")
    alloc = allocation_of(running)
    assert alloc == Allocation(
        uid="uid-a", pod="default/a", node="trn2-0", cores=False, ids=(4, 5, 6, 7)
    )
    done = pod("a", count=4, annotations=annotations, node_name="trn2-0", phase="Succeeded")
    assert allocation_of(done) is None


def test_aws_annotations_without_resource_type_follow_the_pods_request() -> None:
    p = pod(
        "c",
        resource=CORE_RESOURCE,
        count=2,
        annotations={"AWS_NEURON_IDS": "2,3"},
        node_name="inf1-0",
    )
    alloc = allocation_of(p, ask=ask_of(p))
    assert alloc is not None
    assert alloc.cores
    assert alloc.ids == (2, 3)


def test_reserve_refuses_a_held_core_and_changes_nothing() -> None:
    s = shape("trn2.48xlarge", name="trn2-0")
    ledger = Ledger()
    ledger.reserve(Allocation(uid="1", pod="ns/a", node="trn2-0", cores=False, ids=(0,)), s)
    with pytest.raises(Conflict, match="Node trn2-0: cores 2,3 are already allocated"):
        ledger.reserve(Allocation(uid="2", pod="ns/b", node="trn2-0", cores=True, ids=(2, 3, 4)), s)
    assert ledger.used(s) == frozenset(range(4))


def test_a_request_that_is_not_a_whole_number_names_the_pod_and_field() -> None:
    with pytest.raises(AskError, match=r"Pod default/x: spec.containers\[main\]"):
        ask_of(pod("x", count="1.5"))


def test_devices_and_cores_at_once_are_refused() -> None:
    p = pod("both")
    p.spec.containers[0].resources.limits[CORE_RESOURCE] = "2"
    with pytest.raises(AskError, match="not both"):
        ask_of(p)
