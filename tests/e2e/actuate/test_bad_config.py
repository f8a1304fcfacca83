"""A claim with a bad opaque config keeps its pod from running, with an Event that names the
field; the other claims of the node are not affected."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.actuate.pods import claim_pod
from tests.e2e.actuate.support import Actuate

pytestmark = pytest.mark.stack

NODE = "trn2-48xl-0"


def messages(actuate: Actuate, pod: str) -> str:
    """The text of every Event about ``pod``, one per line."""
    return "\n".join(f"{e.get('reason')}: {e.get('message', '')}" for e in actuate.events_for(pod))


@pytest.mark.parametrize(
    ("name", "parameters", "field"),
    [
        (
            "bad-lnc",
            {"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": 3},
            "logicalNeuronCore: 3 is not one of",
        ),
        (
            "bad-kind",
            {"apiVersion": "neuron.aws.com/v1", "kind": "GpuConfig"},
            "kind: 'GpuConfig' is not a kind of neuron.aws.com",
        ),
    ],
)
def test_bad_config_fails_only_its_pod(
    actuate: Actuate, name: str, parameters: dict[str, Any], field: str
) -> None:
    actuate.apply(claim_pod(f"{name}-neighbour", node=NODE, count=4))
    actuate.apply(claim_pod(name, node=NODE, count=1, parameters=parameters))
    try:
        actuate.wait_running(f"{name}-neighbour")
        try:
            message = actuate.stack.wait_for(
                f"an Event about {name} naming the field",
                lambda: field in (m := messages(actuate, name)) and m,
                timeout=90,
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}; events:\n{messages(actuate, name)}") from None
        assert "ResourceClaim default/" in message
        assert actuate.pod(name)["status"].get("phase") == "Pending"
        claim = actuate.claim_of(name)
        # Nothing of the failed claim is left on the node; the neighbour's spec is intact.
        specs = actuate.cdi_specs(NODE)
        assert claim["metadata"]["uid"] not in specs
        assert claim["metadata"]["uid"] not in actuate.checkpoint(NODE)
        neighbour = actuate.claim_of(f"{name}-neighbour")["metadata"]["uid"]
        assert neighbour in specs
        assert actuate.checkpoint(NODE)[neighbour]["state"] == "PrepareCompleted"
    finally:
        actuate.delete_pod(name)
        actuate.delete_pod(f"{name}-neighbour")
