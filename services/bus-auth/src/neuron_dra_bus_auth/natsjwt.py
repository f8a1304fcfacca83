"""NATS JWTs (version 2) as the server reads them: encode with an nkey, decode, verify.

A NATS JWT is ``base64url(header).base64url(claims).base64url(signature)`` without padding,
the header ``{"typ":"JWT","alg":"ed25519-nkey"}``, the signature ed25519 over the first two
parts by the issuer's nkey, and ``jti`` a base32 SHA-512/256 of the claims written without
it. Pure: no I/O, the clock is an argument.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from typing import Any, Final

import msgspec
import nacl.exceptions
import nacl.signing
import nkeys

from neuron_dra_bus_auth.permissions import Permissions

__all__ = [
    "JwtError",
    "Signer",
    "authorization_response",
    "decode_claims",
    "new_account_seed",
    "public_key_bytes",
    "user_claims",
]

_HEADER: Final = {"typ": "JWT", "alg": "ed25519-nkey"}
#: NATS limits: -1 is "no limit" (0 would allow nothing).
_NO_LIMIT: Final = -1


class JwtError(ValueError):
    """A JWT that cannot be read: the message says which part and why."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str, *, part: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise JwtError(f"JWT {part}: not base64url ({exc})") from None


def new_account_seed() -> bytes:
    """A fresh account nkey seed (``SA...``), the callout's issuer."""
    return bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_ACCOUNT))


def public_key_bytes(public_key: str) -> bytes:
    """The raw ed25519 key of an encoded public nkey (``A...``, ``N...``, ``U...``)."""
    try:
        raw = base64.b32decode(public_key + "=" * (-len(public_key) % 8))
    except (binascii.Error, ValueError) as exc:
        raise JwtError(f"nkey {public_key!r}: not base32 ({exc})") from None
    if len(raw) != 35 or not nkeys.valid_public_prefix_byte(raw[0]):
        raise JwtError(f"nkey {public_key!r}: not a public nkey")
    if int.from_bytes(raw[-2:], "little") != nkeys.crc16(raw[:-2]):
        raise JwtError(f"nkey {public_key!r}: checksum does not match")
    return raw[1:-2]


class Signer:
    """Signs claims as the account nkey of ``seed`` (the auth callout's ``issuer``)."""

    def __init__(self, seed: bytes) -> None:
        try:
            self._keys = nkeys.from_seed(bytearray(seed.strip()))
        except nkeys.NkeysError as exc:
            raise ValueError(f"issuer seed: {exc}") from None
        self.public_key: str = bytes(self._keys.public_key).decode()
        if not self.public_key.startswith("A"):
            raise ValueError(f"issuer seed: {self.public_key[:1]}... is not an account key")

    def encode(self, claims: dict[str, Any], *, now: int) -> str:
        """``claims`` with ``iss``, ``iat`` and ``jti`` set, signed."""
        body = {**claims, "iss": self.public_key, "iat": now}
        body.pop("jti", None)
        digest = hashlib.new("sha512_256", msgspec.json.encode(body)).digest()
        body["jti"] = base64.b32encode(digest).rstrip(b"=").decode()
        signing_input = f"{_b64(msgspec.json.encode(_HEADER))}.{_b64(msgspec.json.encode(body))}"
        signature = self._keys.sign(signing_input.encode())
        return f"{signing_input}.{_b64(signature)}"


def decode_claims(token: str, *, now: int) -> dict[str, Any]:
    """The claims of ``token`` once its signature by its own ``iss`` is checked, and it is
    not expired at ``now``."""
    parts = token.strip().split(".")
    if len(parts) != 3:
        raise JwtError(f"JWT: {len(parts)} parts, not 3")
    header = msgspec.json.decode(_unb64(parts[0], part="header"))
    if not isinstance(header, dict) or header.get("alg") != _HEADER["alg"]:
        raise JwtError(f"JWT header: algorithm {header!r} is not ed25519-nkey")
    claims = msgspec.json.decode(_unb64(parts[1], part="claims"))
    if not isinstance(claims, dict):
        raise JwtError("JWT claims: not a JSON object")
    issuer = str(claims.get("iss", ""))
    key = nacl.signing.VerifyKey(public_key_bytes(issuer))
    try:
        key.verify(f"{parts[0]}.{parts[1]}".encode(), _unb64(parts[2], part="signature"))
    except nacl.exceptions.BadSignatureError:
        raise JwtError(f"JWT: signature does not match its issuer {issuer}") from None
    expires = claims.get("exp", 0)
    if isinstance(expires, int) and expires and expires < now:
        raise JwtError(f"JWT: expired at {expires} (now {now})")
    return claims


def user_claims(
    *,
    user_nkey: str,
    account: str,
    name: str,
    permissions: Permissions,
    expires: int,
) -> dict[str, Any]:
    """A user JWT's claims: ``user_nkey`` placed in ``account`` with ``permissions``."""
    nats: dict[str, Any] = {
        "pub": {"allow": list(permissions.publish)},
        "sub": {"allow": list(permissions.subscribe)},
        "subs": _NO_LIMIT,
        "data": _NO_LIMIT,
        "payload": _NO_LIMIT,
        "type": "user",
        "version": 2,
    }
    if permissions.publish_deny:
        nats["pub"]["deny"] = list(permissions.publish_deny)
    if permissions.respond:
        # One reply per request received; a reply later than the request's own timeout is late.
        nats["resp"] = {"max": 1, "ttl": 0}
    return {"sub": user_nkey, "aud": account, "name": name, "exp": expires, "nats": nats}


def authorization_response(
    *, user_nkey: str, server_id: str, user_jwt: str = "", error: str = ""
) -> dict[str, Any]:
    """The claims answering one authorization request: a user JWT, or an error."""
    if bool(user_jwt) == bool(error):
        raise ValueError("authorization response: exactly one of user_jwt and error")
    nats: dict[str, Any] = {"type": "authorization_response", "version": 2}
    if user_jwt:
        nats["jwt"] = user_jwt
    else:
        nats["error"] = error
    return {"sub": user_nkey, "aud": server_id, "nats": nats}
