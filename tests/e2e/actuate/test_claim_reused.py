"""A ResourceClaim used by one pod after another on the same node: each preparation is an
event of its own on the bus, so an audit subscriber reads the claim prepared again."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.actuate.bus import claim_subject, last_stored
from tests.e2e.actuate.pods import claim_user
from tests.e2e.actuate.support import Actuate

pytestmark = pytest.mark.stack

NODE = "inf2-48xl-0"
CLAIM = "shared-neuron"


def _claim() -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": CLAIM, "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [{"name": "neurons", "exactly": {"deviceClassName": "neuron.aws.com"}}]
            }
        },
    }


def test_a_claim_prepared_again_on_its_node_is_told_again(actuate: Actuate) -> None:
    stack = actuate.stack
    prepared = claim_subject("prepared", node=NODE, namespace="default", name=CLAIM)
    unprepared = claim_subject("unprepared", node=NODE, namespace="default", name=CLAIM)
    actuate.apply([_claim(), claim_user("first-user", node=NODE, claim=CLAIM)])
    try:
        actuate.wait_running("first-user")
        first = actuate.stack.wait_for(
            "the first ClaimPrepared", lambda: last_stored(stack, prepared)
        )
        actuate.delete_pod("first-user")
        gone = actuate.stack.wait_for("the ClaimUnprepared", lambda: last_stored(stack, unprepared))
        assert gone[0] > first[0]
        # Within the claims stream's duplicate window (120 s): the same id would be dropped.
        actuate.apply(claim_user("second-user", node=NODE, claim=CLAIM))
        actuate.wait_running("second-user")
        again = actuate.stack.wait_for(
            "the second ClaimPrepared",
            lambda: (found := last_stored(stack, prepared)) and found[0] > gone[0] and found,
        )
        assert again[1] != first[1], "the second preparation was told under the first one's id"
    finally:
        actuate.delete_pod("first-user")
        actuate.delete_pod("second-user")
        actuate.stack.kubectl("delete", "resourceclaim", CLAIM, "--ignore-not-found")
