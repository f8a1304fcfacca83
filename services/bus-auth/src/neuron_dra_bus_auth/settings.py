"""The auth callout's settings; every field also reads ``NEURON_DRA_<FIELD>``
(e.g. ``NEURON_DRA_ISSUER_SEED_FILE``)."""

from __future__ import annotations

from typing import Annotated, ClassVar

import msgspec
from neuron_dra_common.settings import ServiceSettings

__all__ = ["BusAuthSettings"]


class BusAuthSettings(ServiceSettings, frozen=True, kw_only=True):
    """Admits NATS clients by their ServiceAccount token; grants their identity's subjects."""

    #: Its own NATS user (auth_users), not a token: the callout cannot admit itself.
    bus_credentials: ClassVar[tuple[str, ...]] = ("nats_password_file", "nats_tls_ca")

    kubeconfig: Annotated[
        str, msgspec.Meta(description="kubeconfig file; empty: KUBECONFIG, else in-cluster")
    ] = ""
    namespace: Annotated[
        str,
        msgspec.Meta(
            min_length=1, description="Namespace of the ServiceAccounts that have bus identities"
        ),
    ] = "neuron-dra-driver"
    issuer_seed_file: Annotated[
        str,
        msgspec.Meta(
            min_length=1,
            description="Account nkey seed (SA...) that signs the answers; its public key is "
            "the server's auth_callout issuer",
        ),
    ] = "/etc/neuron-dra/bus-auth/issuer.nk"
    nats_user: Annotated[
        str, msgspec.Meta(min_length=1, description="This service's own NATS user (auth_users)")
    ] = "neuron-dra-bus-auth"
    nats_password_file: Annotated[
        str, msgspec.Meta(description="File holding that user's password; empty: none")
    ] = ""
    account: Annotated[
        str,
        msgspec.Meta(min_length=1, description="NATS account the admitted clients are placed in"),
    ] = "NEURON"
    token_audiences: Annotated[
        tuple[str, ...],
        msgspec.Meta(
            min_length=1,
            description="Audiences a token must be made for, comma-separated; the callout asks "
            "the TokenReview for them and refuses a token whose review does not return one",
        ),
    ] = ("neuron-dra-bus",)
    user_seconds: Annotated[
        int,
        msgspec.Meta(
            ge=60,
            description="Lifetime of a granted NATS user; the client reconnects (with its "
            "current token) when it ends",
        ),
    ] = 3600
