"""Alertmanager's v2 API: the one module of the alerts service that speaks HTTP.

``POST /api/v2/alerts`` takes a list of alerts, each ``{labels, annotations, startsAt,
endsAt, generatorURL}``. Alertmanager identifies an alert by its label set: posting the same
labels again updates it (a re-send), and an ``endsAt`` in the past resolves it. An alert
whose ``endsAt`` passes without a re-send resolves by itself, so a firing alert is sent with
an ``endsAt`` a few re-sends ahead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

import msgspec
from neuron_dra_common.httpclient import HttpClient

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
        self._timeout = timeout
        self._http = HttpClient(self.base_url, pool_size=4)

    async def _call(
        self, method: str, path: str, *, body: bytes | None = None
    ) -> tuple[int, bytes]:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        async with asyncio.timeout(self._timeout):
            response = await self._http.request(method, path, headers=headers, body=body)
            async with response:
                return response.status, await response.read()

    async def post(self, alerts: Sequence[PostableAlert]) -> None:
        """Send ``alerts``; :class:`AlertmanagerError` when they were not accepted."""
        if not alerts:
            return
        url = f"{self.base_url}/api/v2/alerts"
        try:
            status, text = await self._call(
                "POST", "/api/v2/alerts", body=_encoder.encode(list(alerts))
            )
        except (OSError, TimeoutError) as exc:
            raise AlertmanagerError(f"POST {url}: {exc!r}") from exc
        if status >= 300:
            shown = text[:500].decode(errors="replace")
            raise AlertmanagerError(f"POST {url}: HTTP {status}: {shown}")

    async def alerts(self, *, active: bool = True, filters: Sequence[str] = ()) -> list[Any]:
        """``GET /api/v2/alerts`` (``filters`` as Alertmanager's matchers, ``name="value"``)."""
        url = f"{self.base_url}/api/v2/alerts"
        params: list[tuple[str, str]] = [("active", "true" if active else "false")]
        params += [("filter", f) for f in filters]
        try:
            status, text = await self._call("GET", f"/api/v2/alerts?{urlencode(params)}")
        except (OSError, TimeoutError) as exc:
            raise AlertmanagerError(f"GET {url}: {exc!r}") from exc
        if status >= 300:
            raise AlertmanagerError(f"GET {url}: HTTP {status}")
        try:
            found: list[Any] = msgspec.json.decode(text)
        except msgspec.DecodeError as exc:
            raise AlertmanagerError(f"GET {url}: not JSON: {exc}") from exc
        return found

    async def close(self) -> None:
        await self._http.close()
