"""Ask the apiserver who a token belongs to (``authentication.k8s.io/v1`` TokenReview)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import msgspec
from neuron_dra_common.kube import KubeClient, Resource

from neuron_dra_bus_auth.identities import Review

__all__ = ["TOKEN_REVIEWS", "review_token"]

TOKEN_REVIEWS: Final = Resource(
    group="authentication.k8s.io", version="v1", plural="tokenreviews", kind="TokenReview"
)


class _User(msgspec.Struct, frozen=True):
    username: str = ""
    extra: dict[str, tuple[str, ...]] = {}


class _Status(msgspec.Struct, frozen=True):
    authenticated: bool = False
    user: _User = _User()
    audiences: tuple[str, ...] = ()
    error: str = ""


async def review_token(client: KubeClient, token: str, *, audiences: Sequence[str]) -> Review:
    """The apiserver's verdict on ``token`` made for one of ``audiences`` (its answer names
    the audiences it matched, which :func:`~neuron_dra_bus_auth.identities.identify` checks)."""
    if not audiences:
        raise ValueError("TokenReview: no audience asked for")
    spec: dict[str, Any] = {"token": token, "audiences": list(audiences)}
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}
    answer = await client.create(TOKEN_REVIEWS, body)
    status = msgspec.convert(answer.get("status") or {}, _Status)
    return Review(
        authenticated=status.authenticated,
        username=status.user.username,
        extra=status.user.extra,
        audiences=status.audiences,
        error=status.error,
    )
