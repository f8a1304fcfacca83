"""Whether the apiserver is reached past the environment's proxy: ``NO_PROXY`` as Go reads it.

kubectl and every Go client decide with ``golang.org/x/net/http/httpproxy``: a ``NO_PROXY``
entry may be a CIDR (``10.0.0.0/8``) that matches an IP-literal host, an IP, a domain that
matches itself and its subdomains, ``.domain`` for subdomains only, any of them with a
``:port``, or ``*``; ``localhost`` and loopback addresses never go through a proxy.
aiohttp (which kubernetes-asyncio's transport uses, with ``trust_env``) decides with the
standard library's ``urllib.request.proxy_bypass`` at every request, which knows no CIDR.

aiohttp has no setting for the decision other than the environment, so
:func:`honour_no_proxy` makes Go's answer the environment's: when Go would bypass the proxy
for the apiserver's IP and urllib would not, the IP itself is added to ``NO_PROXY`` and
``no_proxy`` of this process (which urllib then matches exactly). Only this process and the
programs it starts (exec credential plugins) see the longer list, and only entries that Go
already bypasses are added.

>>> bypasses_proxy("10.1.2.3", "6443", "example.com,10.0.0.0/8")
True
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import MutableMapping
from urllib.parse import urlsplit
from urllib.request import proxy_bypass_environment  # type: ignore[attr-defined]

__all__ = ["bypasses_proxy", "honour_no_proxy"]

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def _ip(text: str) -> Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _split_port(entry: str) -> tuple[str, str]:
    """``host:port`` / ``[v6]:port`` -> (host, port); anything else is all host."""
    if entry.startswith("["):
        host, sep, rest = entry[1:].partition("]")
        if sep and (not rest or (rest.startswith(":") and rest[1:].isdigit())):
            return host, rest[1:]
        return entry, ""
    host, sep, port = entry.rpartition(":")
    if sep and host and ":" not in host and port.isdigit():
        return host, port
    return entry, ""


def bypasses_proxy(host: str, port: str, no_proxy: str) -> bool:
    """Whether Go's ``httpproxy`` connects to ``host:port`` directly under ``no_proxy``.

    >>> bypasses_proxy("192.168.1.7", "443", "192.168.0.0/16")
    True
    >>> bypasses_proxy("api.example.com", "443", ".example.com:8443")
    False
    """
    host = host.strip().lower().strip("[]")
    if host == "localhost":
        return True
    ip = _ip(host)
    if ip is not None and ip.is_loopback:
        return True
    for raw in no_proxy.split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return True
        if "/" in entry:
            try:
                network = ipaddress.ip_network(entry, strict=False)
            except ValueError:
                continue
            if ip is not None and ip.version == network.version and ip in network:
                return True
            continue
        name, entry_port = _split_port(entry)
        if not name:
            continue
        if entry_port and entry_port != port:
            continue
        entry_ip = _ip(name)
        if entry_ip is not None:
            if ip is not None and entry_ip == ip:
                return True
            continue
        if name.startswith("*."):
            name = name[1:]
        exact = not name.startswith(".")
        suffix = name if name.startswith(".") else "." + name
        if host.endswith(suffix) or (exact and host == name):
            return True
    return False


def honour_no_proxy(server: str, environ: MutableMapping[str, str] | None = None) -> bool:
    """Make the environment bypass the proxy for ``server`` when Go's rules do and urllib's
    do not (see the module's docstring). Returns True when the environment was changed."""
    env = os.environ if environ is None else environ
    parts = urlsplit(server)
    host = parts.hostname or ""
    if _ip(host) is None:
        return False  # a name: urllib's suffix matching agrees with Go's closely enough
    scheme = parts.scheme.lower()
    if not (env.get(f"{scheme}_proxy") or env.get(f"{scheme.upper()}_PROXY")):
        return False  # no proxy to bypass
    # urllib reads the lower-case variables first.
    no_proxy = env.get("no_proxy") or env.get("NO_PROXY") or ""
    port = str(parts.port or (443 if parts.scheme == "https" else 80))
    if not bypasses_proxy(host, port, no_proxy):
        return False
    if proxy_bypass_environment(host, {"no": no_proxy}):
        return False
    extended = f"{no_proxy},{host}" if no_proxy else host
    env["no_proxy"] = env["NO_PROXY"] = extended
    return True
