"""One authorization request in, one signed answer out: what the NATS server will read."""

from __future__ import annotations

import base64
import os

import msgspec
import nkeys
import pytest
from neuron_dra_bus_auth.callout import Callout
from neuron_dra_bus_auth.identities import NODE_NAME_EXTRA, Review
from neuron_dra_bus_auth.natsjwt import Signer, decode_claims, new_account_seed

NOW = 1_800_000_000
USER_NKEY = "UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4"
NS = "neuron-dra-driver"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _request(*, token: str) -> bytes:
    """A request as the server signs it, with its own (server) nkey."""
    server = nkeys.from_seed(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_SERVER))
    claims = {
        "iss": bytes(server.public_key).decode(),
        "sub": "AISSUER",
        "aud": "nats-authorization-request",
        "exp": NOW + 2,
        "nats": {
            "server_id": {"name": "n", "host": "h", "id": "NSERVERID"},
            "user_nkey": USER_NKEY,
            "client_info": {"name": "discovery-n1", "host": "10.0.0.1"},
            "connect_opts": {"auth_token": token, "protocol": 1},
            "type": "authorization_request",
            "version": 2,
        },
    }
    head = _b64(msgspec.json.encode({"typ": "JWT", "alg": "ed25519-nkey"}))
    body = _b64(msgspec.json.encode(claims))
    signature = _b64(server.sign(f"{head}.{body}".encode()))
    return f"{head}.{body}.{signature}".encode()


def _callout(signer: Signer, reviews: dict[str, Review]) -> Callout:
    async def review(token: str) -> Review:
        return reviews.get(token, Review(authenticated=False, error="unknown token"))

    return Callout(
        signer=signer,
        review=review,
        namespace=NS,
        audiences=("neuron-dra-bus",),
        account="NEURON",
        user_seconds=600,
        clock=lambda: NOW,
    )


async def test_an_admitted_node_agent_gets_its_nodes_subjects() -> None:
    signer = Signer(new_account_seed())
    review = Review(
        authenticated=True,
        username=f"system:serviceaccount:{NS}:neuron-dra-discovery",
        extra={NODE_NAME_EXTRA: ("n1",)},
        audiences=("neuron-dra-bus",),
    )
    answer = await _callout(signer, {"t1": review}).answer(_request(token="t1"))
    response = decode_claims(answer.decode(), now=NOW)
    assert response["iss"] == signer.public_key
    assert response["sub"] == USER_NKEY
    assert response["aud"] == "NSERVERID"
    assert response["nats"]["type"] == "authorization_response"
    user = decode_claims(response["nats"]["jwt"], now=NOW)
    assert user["sub"] == USER_NKEY
    assert user["aud"] == "NEURON"
    assert user["name"] == "discovery@n1"
    assert user["exp"] == NOW + 600
    assert "neuron.inventory.n1" in user["nats"]["pub"]["allow"]


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        ("", "no token: connect with the pod's projected ServiceAccount token"),
        ("stolen", "token not authenticated: unknown token"),
    ],
)
async def test_a_refusal_is_answered_with_its_reason(token: str, reason: str) -> None:
    signer = Signer(new_account_seed())
    answer = await _callout(signer, {}).answer(_request(token=token))
    response = decode_claims(answer.decode(), now=NOW)
    assert response["nats"]["error"] == reason
    assert "jwt" not in response["nats"]


async def test_an_unreadable_request_gets_no_answer() -> None:
    answer = await _callout(Signer(new_account_seed()), {}).answer(b"not a jwt")
    assert answer == b""
