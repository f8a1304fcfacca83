"""Properties of the extender's decisions over random sequences of requests and releases."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from neuron_dra_common.topology import is_connected_set, valid_counts
from neuron_dra_scheduler_extender.decide import fits, judge, place
from neuron_dra_scheduler_extender.inputs import CORE_RESOURCE, DEVICE_RESOURCE, Ask
from neuron_dra_scheduler_extender.ledger import Allocation, Ledger

from .helpers import shape

INSTANCES = ("inf1.6xlarge", "inf2.24xlarge", "inf2.48xlarge", "trn1.32xlarge", "trn2.48xlarge")

steps = st.lists(
    st.tuples(
        st.sampled_from((DEVICE_RESOURCE, CORE_RESOURCE, "release")),
        st.integers(min_value=1, max_value=40),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(instance=st.sampled_from(INSTANCES), script=steps)
def test_no_core_twice_no_shared_device_and_connected_sets(
    instance: str, script: list[tuple[str, int]]
) -> None:
    s = shape(instance)
    ledger = Ledger()
    live: list[Allocation] = []
    for n, (kind, count) in enumerate(script):
        if kind == "release":
            if live:
                ledger.release(live.pop(count % len(live)).uid)
            continue
        ask = Ask(resource=kind, count=count)
        placement = place(s, ask, ledger.used(s))
        # The filter's quick answer agrees with the bind's search.
        assert fits(s, ask, ledger.used(s)) == (placement is not None)
        if placement is None:
            continue
        ids = placement.cores if ask.cores else placement.devices
        alloc = Allocation(uid=str(n), pod=f"ns/p{n}", node=s.name, cores=ask.cores, ids=ids)
        ledger.reserve(alloc, s)  # raises on a core handed out twice
        live.append(alloc)
        # Cores packed on as few devices as possible, on connected devices.
        assert len(placement.devices) == s.devices_needed(len(placement.cores))
        assert {s.device_of(c) for c in placement.cores} == set(placement.devices)
        if len(placement.devices) > 1 or not ask.cores:
            assert is_connected_set(s.spec, placement.devices)
    # A device given to a device request is never shared with another pod.
    for a in live:
        if a.cores:
            continue
        mine = a.core_ids(s)
        for b in live:
            if b.uid != a.uid:
                assert not mine & b.core_ids(s)


@settings(max_examples=200, deadline=None)
@given(instance=st.sampled_from(INSTANCES), count=st.integers(min_value=1, max_value=20))
def test_invalid_device_counts_are_refused_with_aws_text_and_valid_ones_fit_an_empty_node(
    instance: str, count: int
) -> None:
    s = shape(instance)
    verdict = judge(s, Ask(resource=DEVICE_RESOURCE, count=count), ())
    if count in valid_counts(s.spec):
        assert not hasattr(verdict, "message")
    else:
        assert getattr(verdict, "final", False)
        assert getattr(verdict, "message", "") == (
            f"Instance type {instance} does not support requests for device: {count}. "
            "Please request a different number of devices."
        )
