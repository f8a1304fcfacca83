"""Alertmanager's v2 API: the one module of the alerts service that speaks HTTP.

``POST /api/v2/alerts`` takes a list of alerts, each ``{labels, annotations, startsAt,
endsAt, generatorURL}``. Alertmanager identifies an alert by its label set: posting the same
labels again updates it (a re-send), and an ``endsAt`` in the past resolves it. An alert
whose ``endsAt`` passes without a re-send resolves by itself, so a firing alert is sent with
an ``endsAt`` a few re-sends ahead.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import aiohttp
import msgspec

__all__ = ["AlertmanagerClient", "AlertmanagerError", "PostableAlert"]


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
    """A small client of one Alertmanager (``base_url`` such as ``http://am:9093``)."""

    def __init__(self, base_url: str, *, timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session

    async def post(self, alerts: Sequence[PostableAlert]) -> None:
        """Send ``alerts``; :class:`AlertmanagerError` when they were not accepted."""
        if not alerts:
            return
        url = f"{self.base_url}/api/v2/alerts"
        body = _encoder.encode(list(alerts))
        try:
            async with self._http().post(
                url, data=body, headers={"Content-Type": "application/json"}
            ) as resp:
                if resp.status >= 300:
                    text = (await resp.text())[:500]
                    raise AlertmanagerError(f"POST {url}: HTTP {resp.status}: {text}")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise AlertmanagerError(f"POST {url}: {exc!r}") from exc

    async def alerts(self, *, active: bool = True, filters: Sequence[str] = ()) -> list[Any]:
        """``GET /api/v2/alerts`` (``filters`` as Alertmanager's matchers, ``name="value"``)."""
        url = f"{self.base_url}/api/v2/alerts"
        params: list[tuple[str, str]] = [("active", "true" if active else "false")]
        params += [("filter", f) for f in filters]
        try:
            async with self._http().get(url, params=params) as resp:
                if resp.status >= 300:
                    raise AlertmanagerError(f"GET {url}: HTTP {resp.status}")
                found: list[Any] = await resp.json()
                return found
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise AlertmanagerError(f"GET {url}: {exc!r}") from exc

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
