"""Answer one authorization request of the NATS server.

The server sends, on ``$SYS.REQ.USER.AUTH``, a JWT whose claims carry the client's CONNECT
options (``connect_opts.auth_token``: the pod's projected ServiceAccount token), the user
nkey it generated for this connection (``user_nkey``) and its own id (``server_id.id``). The
answer is a JWT signed by the issuer with ``sub`` that nkey and ``aud`` that server id,
holding either a user JWT (the identity's permissions) or an error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from neuron_dra_bus_auth.identities import Identity, Refusal, Review, identify
from neuron_dra_bus_auth.natsjwt import (
    JwtError,
    Signer,
    authorization_response,
    decode_claims,
    user_claims,
)
from neuron_dra_bus_auth.permissions import permissions_for

__all__ = ["Callout", "TokenReviewer"]

log = logging.getLogger(__name__)

#: Asks the apiserver about a token (a TokenReview); raises on a failed call.
TokenReviewer = Callable[[str], Awaitable[Review]]


class Callout:
    """Turns authorization requests into signed answers; every refusal is logged with why."""

    def __init__(
        self,
        *,
        signer: Signer,
        review: TokenReviewer,
        namespace: str,
        audiences: tuple[str, ...],
        account: str,
        user_seconds: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._signer = signer
        self._review = review
        self._namespace = namespace
        self._audiences = audiences
        self._account = account
        self._user_seconds = user_seconds
        self._clock = clock

    async def answer(self, request: bytes) -> bytes:
        """The response JWT for ``request`` (an error answer when it cannot be read)."""
        now = int(self._clock())
        try:
            claims = decode_claims(request.decode(errors="replace"), now=now)
        except JwtError as exc:
            # Without a readable request there is no nkey or server to answer to: the
            # server times the client out.
            log.warning("auth callout: unreadable request", extra={"reason": str(exc)})
            return b""
        nats: dict[str, Any] = claims.get("nats") or {}
        user_nkey = str(nats.get("user_nkey", ""))
        server_id = str((nats.get("server_id") or {}).get("id", ""))
        client = nats.get("client_info") or {}
        where = {"client": client.get("name", ""), "host": client.get("host", "")}
        try:
            identity = await self._identify(nats)
        except Refusal as exc:
            log.warning("auth callout: refused", extra={"reason": str(exc), **where})
            response = authorization_response(
                user_nkey=user_nkey, server_id=server_id, error=str(exc)
            )
            return self._signer.encode(response, now=now).encode()
        user_jwt = self._signer.encode(
            user_claims(
                user_nkey=user_nkey,
                account=self._account,
                name=identity.name,
                permissions=permissions_for(identity.role, node=identity.node),
                expires=now + self._user_seconds,
            ),
            now=now,
        )
        log.info(
            "auth callout: admitted",
            extra={"identity": identity.name, "service_account": identity.service_account, **where},
        )
        response = authorization_response(
            user_nkey=user_nkey, server_id=server_id, user_jwt=user_jwt
        )
        return self._signer.encode(response, now=now).encode()

    async def _identify(self, nats: dict[str, Any]) -> Identity:
        token = str((nats.get("connect_opts") or {}).get("auth_token", ""))
        if not token:
            raise Refusal("no token: connect with the pod's projected ServiceAccount token")
        try:
            review = await self._review(token)
        except Exception as exc:  # the apiserver's failure refuses, it does not crash us
            raise Refusal(f"TokenReview failed: {exc}") from None
        return identify(review, namespace=self._namespace, audiences=self._audiences)
