"""From a TokenReview's answer to a bus identity, and the refusals with their reasons."""

from __future__ import annotations

import pytest
from neuron_dra_bus_auth.identities import NODE_NAME_EXTRA, Refusal, Review, identify

NS = "neuron-dra-driver"


def _review(account: str, *, node: str | None = None) -> Review:
    extra: dict[str, tuple[str, ...]] = {NODE_NAME_EXTRA: (node,)} if node is not None else {}
    return Review(authenticated=True, username=f"system:serviceaccount:{account}", extra=extra)


def test_a_node_agent_is_bound_to_the_node_in_its_token() -> None:
    identity = identify(_review(f"{NS}:neuron-dra-discovery", node="n1"), namespace=NS)
    assert (identity.role, identity.node, identity.name) == ("discovery", "n1", "discovery@n1")


def test_a_node_agent_without_a_node_is_refused() -> None:
    with pytest.raises(Refusal, match=r"neuron-dra-kubelet-plugin \(kubelet-plugin\): token "):
        identify(_review(f"{NS}:neuron-dra-kubelet-plugin"), namespace=NS)


def test_cluster_services_reader_and_admin() -> None:
    assert identify(_review(f"{NS}:neuron-dra-topology-allocator"), namespace=NS).role == (
        "topology-allocator"
    )
    assert identify(_review(f"{NS}:neuron-dra-bus-reader"), namespace=NS).role == "reader"
    assert identify(_review(f"{NS}:neuron-dra-bus-admin"), namespace=NS).role == "admin"


@pytest.mark.parametrize(
    ("review", "reason"),
    [
        (Review(authenticated=False, error="token expired"), "not authenticated: token expired"),
        (Review(authenticated=True, username="alice"), "'alice' is not a ServiceAccount"),
        (_review("default:default"), "ServiceAccount default/default has no bus identity"),
        (_review("other:neuron-dra-bus-admin"), "other/neuron-dra-bus-admin has no bus"),
    ],
)
def test_refusals_say_why(review: Review, reason: str) -> None:
    with pytest.raises(Refusal, match=reason):
        identify(review, namespace=NS)
