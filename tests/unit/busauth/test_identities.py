"""From a TokenReview's answer to a bus identity, and the refusals with their reasons."""

from __future__ import annotations

import pytest
from neuron_dra_bus_auth.identities import NODE_NAME_EXTRA, Refusal, Review, identify

NS = "neuron-dra-driver"
BUS = ("neuron-dra-bus",)


def _review(account: str, *, node: str | None = None) -> Review:
    extra: dict[str, tuple[str, ...]] = {NODE_NAME_EXTRA: (node,)} if node is not None else {}
    return Review(
        authenticated=True,
        username=f"system:serviceaccount:{account}",
        extra=extra,
        audiences=BUS,
    )


def test_a_node_agent_is_bound_to_the_node_in_its_token() -> None:
    identity = identify(
        _review(f"{NS}:neuron-dra-discovery", node="n1"), namespace=NS, audiences=BUS
    )
    assert (identity.role, identity.node, identity.name) == ("discovery", "n1", "discovery@n1")


def test_a_node_agent_without_a_node_is_refused() -> None:
    with pytest.raises(Refusal, match=r"neuron-dra-kubelet-plugin \(kubelet-plugin\): token "):
        identify(_review(f"{NS}:neuron-dra-kubelet-plugin"), namespace=NS, audiences=BUS)


def test_cluster_services_reader_and_admin() -> None:
    assert identify(
        _review(f"{NS}:neuron-dra-topology-allocator"), namespace=NS, audiences=BUS
    ).role == ("topology-allocator")
    assert (
        identify(_review(f"{NS}:neuron-dra-bus-reader"), namespace=NS, audiences=BUS).role
        == "reader"
    )
    assert (
        identify(_review(f"{NS}:neuron-dra-bus-admin"), namespace=NS, audiences=BUS).role == "admin"
    )


@pytest.mark.parametrize(
    ("review", "reason"),
    [
        (Review(authenticated=False, error="token expired"), "not authenticated: token expired"),
        (
            Review(authenticated=True, username="alice", audiences=BUS),
            "'alice' is not a ServiceAccount",
        ),
        (_review("default:default"), "ServiceAccount default/default has no bus identity"),
        (_review("other:neuron-dra-bus-admin"), "other/neuron-dra-bus-admin has no bus"),
    ],
)
def test_refusals_say_why(review: Review, reason: str) -> None:
    with pytest.raises(Refusal, match=reason):
        identify(review, namespace=NS, audiences=BUS)


@pytest.mark.parametrize("audiences", [(), ("https://kubernetes.default.svc",)])
def test_a_token_whose_review_names_no_bus_audience_is_refused(
    audiences: tuple[str, ...],
) -> None:
    """Even an authenticated review (an apiserver that ignored the audiences asked for) must
    say the token was made for the bus."""
    review = Review(
        authenticated=True,
        username=f"system:serviceaccount:{NS}:neuron-dra-topology-allocator",
        audiences=audiences,
    )
    with pytest.raises(
        Refusal, match=r"token not made for the bus: .* none of \['neuron-dra-bus'\]"
    ):
        identify(review, namespace=NS, audiences=BUS)
