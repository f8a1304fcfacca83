"""Readiness checks for the stack's components."""

from __future__ import annotations

import contextlib
import socket
import ssl
import urllib.error
import urllib.request
from pathlib import Path


def tcp_open(port: int, *, host: str = "127.0.0.1") -> bool:
    """True when something accepts TCP connections on ``host:port``."""
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


def https_ok(
    url: str,
    *,
    ca: Path | None = None,
    cert: Path | None = None,
    key: Path | None = None,
) -> bool:
    """True when ``url`` answers 200 (verifying against ``ca`` when given)."""
    if ca is not None:
        ctx = ssl.create_default_context(cafile=str(ca))
    else:
        # Controller-manager and scheduler serve /healthz on a self-signed certificate.
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cert is not None and key is not None:
        ctx.load_cert_chain(str(cert), str(key))
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=2) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError, ssl.SSLError):
        return False


def http_ok(url: str) -> bool:
    """True when plain-HTTP ``url`` answers 200 (a service's /readyz)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError):
        return False
