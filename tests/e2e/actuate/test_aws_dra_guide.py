"""AWS's Neuron DRA driver guide end to end: the guide's pods run, and their CDI specs give
the container exactly its devices and the Neuron runtime variables for the LNC in force."""

from __future__ import annotations

import pytest
from neuron_dra_common.events import ClaimPrepared, ClaimUnprepared

from tests.e2e.actuate.bus import claim_subject, last_event
from tests.e2e.actuate.support import Actuate, guide_1x4_running, guide_lnc1_running
from tests.fixtures.stack import neuron_dra

pytestmark = pytest.mark.stack


def test_1x4_pod_runs_with_its_four_connected_devices(actuate: Actuate) -> None:
    try:
        node, claim, indices, env = guide_1x4_running(actuate)
        uid = claim["metadata"]["uid"]
        shown = neuron_dra("dev", "env", "pod0", "--state-dir", str(actuate.stack.state_dir))
        assert shown.returncode == 0, shown.stderr
        assert f'export NEURON_RT_VISIBLE_CORES="{env["NEURON_RT_VISIBLE_CORES"]}"' in shown.stdout
        assert 'export NEURON_LOGICAL_NC_CONFIG="2"' in shown.stdout
        for i in indices:
            assert f"  device /dev/neuron{i} " in shown.stdout
            assert f"  cdi neuron.aws.com/neuron={uid}-neurondevice{i}" in shown.stdout
        subject = claim_subject(
            "prepared", node=node, namespace="default", name=claim["metadata"]["name"]
        )
        event = actuate.stack.wait_for(
            "the ClaimPrepared event", lambda: last_event(actuate.stack, subject)
        )
        assert isinstance(event, ClaimPrepared)
        assert event.claim.uid == uid
        assert sorted(event.devices) == sorted(f"neurondevice{i}" for i in indices)
    finally:
        actuate.delete_pod("pod0")
    assert uid not in actuate.cdi_specs(node)
    assert uid not in actuate.checkpoint(node)
    subject = claim_subject(
        "unprepared", node=node, namespace="default", name=claim["metadata"]["name"]
    )
    gone = actuate.stack.wait_for(
        "the ClaimUnprepared event", lambda: last_event(actuate.stack, subject)
    )
    assert isinstance(gone, ClaimUnprepared)
    assert gone.claim.uid == uid


def test_all_neurons_lnc_1_gives_lnc_1_core_ranges(actuate: Actuate) -> None:
    try:
        guide_lnc1_running(actuate)
    finally:
        actuate.delete_pod("pod0")
