"""NATS JWTs written here, read back the way the server reads them."""

from __future__ import annotations

import base64
import json

import pytest
from neuron_dra_bus_auth.natsjwt import (
    JwtError,
    Signer,
    authorization_response,
    decode_claims,
    new_account_seed,
    public_key_bytes,
    user_claims,
)
from neuron_dra_bus_auth.permissions import permissions_for

NOW = 1_800_000_000
USER = "UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4"


def _part(token: str, index: int) -> dict[str, object]:
    text = token.split(".")[index]
    decoded: dict[str, object] = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    return decoded


def test_a_signed_user_jwt_reads_back_with_its_permissions() -> None:
    signer = Signer(new_account_seed())
    token = signer.encode(
        user_claims(
            user_nkey=USER,
            account="NEURON",
            name="discovery@n1",
            permissions=permissions_for("discovery", node="n1"),
            expires=NOW + 60,
        ),
        now=NOW,
    )
    assert "=" not in token
    assert _part(token, 0) == {"typ": "JWT", "alg": "ed25519-nkey"}
    claims = decode_claims(token, now=NOW)
    assert claims["iss"] == signer.public_key
    assert signer.public_key.startswith("A")
    assert claims["sub"] == USER
    assert claims["aud"] == "NEURON"
    assert claims["iat"] == NOW
    assert "neuron.inventory.n1" in claims["nats"]["pub"]["allow"]
    assert claims["nats"]["type"] == "user"
    assert claims["nats"]["subs"] == -1
    assert len(claims["jti"]) == 52  # base32 of 32 bytes, unpadded


def test_a_changed_claim_breaks_the_signature() -> None:
    signer = Signer(new_account_seed())
    token = signer.encode({"sub": USER, "nats": {}}, now=NOW)
    header, _, signature = token.split(".")
    forged = base64.urlsafe_b64encode(
        json.dumps({"sub": USER, "iss": signer.public_key, "nats": {"x": 1}}).encode()
    ).rstrip(b"=")
    with pytest.raises(JwtError, match="signature does not match its issuer"):
        decode_claims(f"{header}.{forged.decode()}.{signature}", now=NOW)


def test_an_expired_jwt_is_refused() -> None:
    token = Signer(new_account_seed()).encode({"sub": USER, "exp": NOW - 1}, now=NOW - 10)
    with pytest.raises(JwtError, match="expired"):
        decode_claims(token, now=NOW)


def test_the_response_carries_either_a_jwt_or_an_error() -> None:
    refused = authorization_response(user_nkey=USER, server_id="NSERVER", error="bad token")
    assert refused["nats"] == {
        "type": "authorization_response",
        "version": 2,
        "error": "bad token",
    }
    assert refused["aud"] == "NSERVER"
    assert refused["sub"] == USER
    with pytest.raises(ValueError, match="exactly one"):
        authorization_response(user_nkey=USER, server_id="N", user_jwt="x", error="y")


def test_a_public_key_with_a_bad_checksum_is_refused() -> None:
    key = Signer(new_account_seed()).public_key
    assert len(public_key_bytes(key)) == 32
    broken = key[:-1] + ("A" if key[-1] != "A" else "B")
    with pytest.raises(JwtError, match=r"nkey .*: (checksum|not)"):
        public_key_bytes(broken)


def test_a_user_seed_is_not_an_issuer() -> None:
    import nkeys

    seed = bytes(nkeys.encode_seed(bytes(32), nkeys.PREFIX_BYTE_USER))
    with pytest.raises(ValueError, match="is not an account key"):
        Signer(seed)
