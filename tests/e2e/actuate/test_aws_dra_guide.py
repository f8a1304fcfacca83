"""AWS's Neuron DRA driver guide end to end: the guide's pods run, and their CDI specs give
the container exactly its devices and the Neuron runtime variables for the LNC in force."""

from __future__ import annotations

import pytest
from neuron_dra_common.events import ClaimPrepared, ClaimUnprepared

from tests.e2e.actuate.bus import claim_subject, last_event
from tests.e2e.actuate.support import MANIFESTS, Actuate, ranges, spec_view
from tests.fixtures.stack import neuron_dra

pytestmark = pytest.mark.stack


def test_1x4_pod_runs_with_its_four_connected_devices(actuate: Actuate) -> None:
    actuate.stack.kubectl("apply", "-f", str(MANIFESTS / "aws-dra-guide-1x4.yaml"))
    try:
        actuate.wait_running("pod0", timeout=120)
        node, claim, indices, env = spec_view(actuate, "pod0")
        assert len(indices) == 4
        assert indices[0] % 4 == 0
        assert indices == list(range(indices[0], indices[0] + 4))
        # trn2 at the default LNC=2: device d owns logical cores 4d..4d+3.
        assert env["NEURON_RT_VISIBLE_CORES"] == ranges(
            [4 * d + c for d in indices for c in range(4)]
        )
        assert env["NEURON_LOGICAL_NC_CONFIG"] == "2"
        uid = claim["metadata"]["uid"]
        assert actuate.checkpoint(node)[uid]["state"] == "PrepareCompleted"
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
            "the ClaimPrepared event", lambda: last_event(actuate.stack.nats_url, subject)
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
        "the ClaimUnprepared event", lambda: last_event(actuate.stack.nats_url, subject)
    )
    assert isinstance(gone, ClaimUnprepared)
    assert gone.claim.uid == uid


def test_all_neurons_lnc_1_gives_lnc_1_core_ranges(actuate: Actuate) -> None:
    actuate.stack.kubectl("apply", "-f", str(MANIFESTS / "aws-dra-guide-lnc1.yaml"))
    try:
        actuate.wait_running("pod0", timeout=120)
        _, _, indices, env = spec_view(actuate, "pod0")
        assert indices == list(range(16))
        assert env["NEURON_LOGICAL_NC_CONFIG"] == "1"
        # LNC=1: device d owns cores 8d..8d+7, so all 16 devices are cores 0-127.
        assert env["NEURON_RT_VISIBLE_CORES"] == "0-127"
    finally:
        actuate.delete_pod("pod0")
