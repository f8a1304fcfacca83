"""Alertmanager's v2 API: the one module of the alerts service that speaks HTTP (aiohttp).

``POST /api/v2/alerts`` takes a list of alerts, each ``{labels, annotations, startsAt,
endsAt, generatorURL}``. Alertmanager identifies an alert by its label set: posting the same
labels again updates it (a re-send), and an ``endsAt`` in the past resolves it. An alert
whose ``endsAt`` passes without a re-send resolves by itself, so a firing alert is sent with
an ``endsAt`` a few re-sends ahead.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

import aiohttp
import msgspec

__all__ = ["AlertmanagerClient", "AlertmanagerError", "PostableAlert"]

#: Connections kept to Alertmanager: a send and a re-send at most are under way at once.
_CONNECTIONS: Final = 4
#: The largest answer read: Alertmanager's list of alerts (a firing fleet's worth).
_MAX_ANSWER: Final = 16 * 2**20
#: How much of an error answer is quoted in the error.
_QUOTED: Final = 500


class AlertmanagerError(Exception):
    """Alertmanager did not accept a request (unreachable, or an error status)."""


class PostableAlert(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """One alert as ``POST /api/v2/alerts`` takes it."""

    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: datetime
    ends_at: datetime
    generator_url: str = ""


_encoder = msgspec.json.Encoder()


class AlertmanagerClient:
    """A small client of one Alertmanager (``base_url`` such as ``http://am:9093``, or with
    the path of a route prefix, ``https://ops.example.com/alertmanager``).

    An ``https`` Alertmanager is verified against the system's trust store. Each request,
    connecting included, has ``timeout`` seconds.
    """

    def __init__(self, base_url: str, *, timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        # Made on first use: a session belongs to the running event loop.
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=_CONNECTIONS),
                timeout=self._timeout,
                headers={"Accept": "application/json"},
                raise_for_status=False,
            )
        return self._session

    async def _call(
        self, method: str, url: str, *, body: bytes | None = None, **params: Any
    ) -> tuple[int, bytes]:
        headers = {"Content-Type": "application/json"} if body is not None else None
        try:
            async with self._client().request(
                method, url, data=body, headers=headers, **params
            ) as response:
                if response.status >= 300:
                    return response.status, await response.content.read(_QUOTED)
                text = await response.content.read(_MAX_ANSWER + 1)
                if len(text) > _MAX_ANSWER:
                    raise AlertmanagerError(
                        f"{method} {url}: the answer is larger than {_MAX_ANSWER} bytes"
                    )
                return response.status, text
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise AlertmanagerError(f"{method} {url}: {exc!r}") from exc

    async def post(self, alerts: Sequence[PostableAlert]) -> None:
        """Send ``alerts``; :class:`AlertmanagerError` when they were not accepted."""
        if not alerts:
            return
        url = f"{self.base_url}/api/v2/alerts"
        status, text = await self._call("POST", url, body=_encoder.encode(list(alerts)))
        if status >= 300:
            shown = text[:_QUOTED].decode(errors="replace")
            raise AlertmanagerError(f"POST {url}: HTTP {status}: {shown}")

    async def alerts(self, *, active: bool = True, filters: Sequence[str] = ()) -> list[Any]:
        """``GET /api/v2/alerts`` (``filters`` as Alertmanager's matchers, ``name="value"``)."""
        url = f"{self.base_url}/api/v2/alerts"
        params: list[tuple[str, str]] = [("active", "true" if active else "false")]
        params += [("filter", f) for f in filters]
        status, text = await self._call("GET", url, params=params)
        if status >= 300:
            raise AlertmanagerError(f"GET {url}: HTTP {status}")
        try:
            found: list[Any] = msgspec.json.decode(text)
        except msgspec.DecodeError as exc:
            raise AlertmanagerError(f"GET {url}: not JSON: {exc}") from exc
        return found

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()
