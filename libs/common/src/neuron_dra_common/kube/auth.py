"""The ``Authorization`` header of a :class:`~neuron_dra_common.kube.config.KubeConfig`.

A static token is sent as is; a token file is re-read once a minute (the kubelet rotates a
pod's projected service-account token well before it expires); an exec credential plugin
runs when its last token is about to expire. A client certificate needs no header.
"""

from __future__ import annotations

import asyncio
import os
import time
from datetime import datetime
from pathlib import Path
from typing import Final

import msgspec

from neuron_dra_common.kube.config import ConfigError, ExecCommand, KubeConfig

__all__ = ["Credentials"]

#: How long a token read from a file is used before it is read again.
TOKEN_FILE_SECONDS: Final = 60.0
#: An exec plugin's token is renewed this long before the expiry it states.
EXEC_MARGIN_SECONDS: Final = 30.0


class _ExecStatus(msgspec.Struct):
    token: str = ""
    expirationTimestamp: str = ""


class _ExecCredential(msgspec.Struct):
    status: _ExecStatus | None = None


class Credentials:
    """Produces the bearer token for each request of one client."""

    def __init__(self, config: KubeConfig) -> None:
        self._config = config
        self._token = config.token
        self._until = float("inf") if config.token else 0.0
        self._lock = asyncio.Lock()

    @property
    def needs_header(self) -> bool:
        c = self._config
        return bool(c.token or c.token_file or c.exec)

    async def authorization(self) -> str | None:
        """``Bearer <token>``, or None when the client authenticates by certificate."""
        if not self.needs_header:
            return None
        if time.monotonic() >= self._until:
            async with self._lock:
                if time.monotonic() >= self._until:
                    await self._refresh()
        return f"Bearer {self._token}"

    def expire(self) -> None:
        """Forget the token (the server refused it): the next request fetches a new one."""
        if not self._config.token:
            self._until = 0.0

    async def _refresh(self) -> None:
        c = self._config
        if c.token_file:
            # A few bytes from a local (tmpfs) file once a minute: not worth a thread.
            self._token = _read_token(c)
            self._until = time.monotonic() + TOKEN_FILE_SECONDS
        elif c.exec is not None:
            self._token, lifetime = await _run_exec(c.exec, source=c.source)
            self._until = time.monotonic() + max(0.0, lifetime - EXEC_MARGIN_SECONDS)


def _read_token(config: KubeConfig) -> str:
    try:
        return Path(config.token_file).read_text().strip()
    except OSError as exc:
        raise ConfigError(
            f"kubeconfig {config.source}: tokenFile {config.token_file} cannot be read: "
            f"{exc.strerror}"
        ) from None


async def _run_exec(plugin: ExecCommand, *, source: str) -> tuple[str, float]:
    """Run the credential plugin; return its token and how long it stays valid."""
    what = f"kubeconfig {source}: exec credential plugin {plugin.command}"
    env = {**os.environ, **dict(plugin.env)}
    request = {"apiVersion": plugin.api_version, "kind": "ExecCredential", "spec": {}}
    env["KUBERNETES_EXEC_INFO"] = msgspec.json.encode(request).decode()
    try:
        proc = await asyncio.create_subprocess_exec(
            plugin.command,
            *plugin.args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
    except OSError as exc:
        raise ConfigError(f"{what} cannot be run: {exc.strerror}") from None
    out, err = await proc.communicate()
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip()[-500:]
        raise ConfigError(f"{what} exited with {proc.returncode}: {tail}")
    try:
        status = msgspec.json.decode(out, type=_ExecCredential).status
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{what} printed no ExecCredential: {exc}") from None
    if status is None or not status.token:
        raise ConfigError(f"{what}: its ExecCredential has no status.token")
    if not status.expirationTimestamp:
        return status.token, float("inf")
    try:
        expiry = datetime.fromisoformat(status.expirationTimestamp.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(
            f"{what}: status.expirationTimestamp {status.expirationTimestamp!r} is not a time"
        ) from None
    return status.token, expiry.timestamp() - time.time()
