"""From a TokenReview's answer to the bus identity it stands for. Pure.

A ServiceAccount ``<namespace>/neuron-dra-<role>`` is that role (``neuron-dra-bus-reader`` and
``neuron-dra-bus-admin`` for the reader and the admin). A node agent's node is the one the
apiserver wrote into its pod-bound token (``authentication.kubernetes.io/node-name``): never
something the client says, so an agent cannot claim another node.
"""

from __future__ import annotations

from typing import Final

import msgspec

from neuron_dra_bus_auth.permissions import NODE_AGENTS, ROLES, Role

__all__ = ["NODE_NAME_EXTRA", "Identity", "Refusal", "Review", "identify", "service_account_of"]

NODE_NAME_EXTRA: Final = "authentication.kubernetes.io/node-name"
_SA_PREFIX: Final = "system:serviceaccount:"


class Review(msgspec.Struct, frozen=True, kw_only=True):
    """What the apiserver said about a token (the fields of TokenReview ``status`` we use)."""

    authenticated: bool
    username: str = ""
    extra: dict[str, tuple[str, ...]] = {}
    #: The audiences the apiserver found the token valid for (``status.audiences``).
    audiences: tuple[str, ...] = ()
    error: str = ""


class Identity(msgspec.Struct, frozen=True, kw_only=True):
    role: Role
    service_account: str
    node: str = ""

    @property
    def name(self) -> str:
        """The user name the server shows for the connection."""
        return f"{self.role}@{self.node}" if self.node else self.role


class Refusal(Exception):
    """The client is not let in; the message is the reason, logged and sent back."""


def service_account_of(role: Role) -> str:
    """The ServiceAccount name of ``role``."""
    return f"neuron-dra-bus-{role}" if role in ("reader", "admin") else f"neuron-dra-{role}"


_ROLE_OF_ACCOUNT: Final[dict[str, Role]] = {service_account_of(role): role for role in ROLES}


def identify(review: Review, *, namespace: str, audiences: tuple[str, ...]) -> Identity:
    """The identity ``review`` proves, or :class:`Refusal` saying why there is none.

    The review must say the token was made for one of ``audiences`` (the bus's): a token for
    the apiserver or for another service is worth nothing here, whoever holds it.
    """
    if not review.authenticated:
        raise Refusal(f"token not authenticated: {review.error or 'no reason given'}")
    if not set(review.audiences) & set(audiences):
        raise Refusal(
            f"token not made for the bus: its review's audiences are "
            f"{list(review.audiences)}, none of {list(audiences)} "
            f"(make it with --audience {audiences[0] if audiences else '<audience>'})"
        )
    if not review.username.startswith(_SA_PREFIX):
        raise Refusal(f"user {review.username!r} is not a ServiceAccount")
    sa_namespace, _, sa_name = review.username.removeprefix(_SA_PREFIX).partition(":")
    account = f"{sa_namespace}/{sa_name}"
    role = _ROLE_OF_ACCOUNT.get(sa_name)
    if sa_namespace != namespace or role is None:
        raise Refusal(f"ServiceAccount {account} has no bus identity")
    if role not in NODE_AGENTS:
        return Identity(role=role, service_account=account)
    nodes = review.extra.get(NODE_NAME_EXTRA, ())
    if len(nodes) != 1 or not nodes[0]:
        raise Refusal(
            f"ServiceAccount {account} ({role}): token carries no {NODE_NAME_EXTRA} "
            "(use a pod-bound projected token of a pod on its node)"
        )
    return Identity(role=role, service_account=account, node=nodes[0])
