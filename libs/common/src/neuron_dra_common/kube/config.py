"""Where the API is and how to authenticate, loaded by kubernetes-asyncio.

The library's loaders (``KubeConfigMerger`` + ``KubeConfigLoader`` for kubeconfig files,
``InClusterConfigLoader`` for a pod's service account) fill a
``kubernetes_asyncio.client.Configuration``; this module only turns our settings into those
calls and their failures into one-line :class:`ConfigError` messages that name the file and
the field. Before the loader runs, the few fields the library would misread silently are
checked (a missing ``server`` becomes ``http://localhost``, ``insecure-skip-tls-verify:
"false"`` turns verification *off*, base64 is decoded leniently, a certificate without its
key fails only at the first TLS handshake).

Exec credential plugins run through :mod:`neuron_dra_common.kube.execguard`, which kills a
plugin (and anything it started) at ``exec_timeout``: the library's ``ExecProvider`` keeps
no handle on the child, and a task awaiting it that is cancelled leaves the child running
(under asyncio's loop and uvloop alike).

>>> config = await load_kubeconfig("/etc/kubernetes/admin.conf")  # doctest: +SKIP
>>> config.server
'https://10.0.0.1:6443'
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import copy
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final, NamedTuple

import yaml
from kubernetes_asyncio.client import Configuration
from kubernetes_asyncio.config.config_exception import ConfigException
from kubernetes_asyncio.config.incluster_config import InClusterConfigLoader
from kubernetes_asyncio.config.kube_config import KubeConfigLoader, KubeConfigMerger

from neuron_dra_common.errors import SetupError
from neuron_dra_common.kube import execguard

__all__ = [
    "EXEC_TIMEOUT",
    "SERVICE_ACCOUNT_DIR",
    "ConfigError",
    "KubeConfig",
    "load_in_cluster",
    "load_kubeconfig",
]

#: Where Kubernetes mounts a pod's service-account token, CA and namespace.
SERVICE_ACCOUNT_DIR: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")
#: How long an exec credential plugin may take before it is killed.
EXEC_TIMEOUT: Final = 30.0
#: How long a token read from a kubeconfig's ``tokenFile`` is used before it is read again.
TOKEN_FILE_SECONDS: Final = 60.0


class ConfigError(SetupError):
    """A kubeconfig (or the pod's service account) that cannot be used; says where and why."""


def _one_line(text: object, limit: int = 300) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


class KubeConfig:
    """How to reach one apiserver: the library's ``Configuration``, where it was read
    (``source``, for errors), and, for an exec credential plugin, the loader that runs it
    again and how to make a new one."""

    def __init__(
        self,
        configuration: Configuration,
        *,
        source: str,
        new_loader: Callable[[], KubeConfigLoader] | None = None,
        loader: KubeConfigLoader | None = None,
        exec_timeout: float = EXEC_TIMEOUT,
    ) -> None:
        self.configuration = configuration
        self.source = source
        self._new_loader = new_loader
        self.loader = loader
        self.exec_timeout = exec_timeout

    def renew_loader(self) -> None:
        """A new loader in place of :attr:`loader`: it has no expiry on record, so it runs the
        plugin at its next call whatever expiry the last token stated (the server refused
        that token)."""
        if self._new_loader is not None:
            self.loader = self._new_loader()

    @property
    def server(self) -> str:
        return str(self.configuration.host or "")

    @property
    def ca_file(self) -> str:
        return str(self.configuration.ssl_ca_cert or "")

    def expire_token(self) -> None:
        """The server refused the token (401): a token file is read again at the next call."""
        hook = self.configuration.refresh_api_key_hook
        if isinstance(hook, _TokenFile):
            hook.expire()

    def with_server(self, server: str) -> KubeConfig:
        """The same credentials for another address (a relay, a port-forward)."""
        configuration = copy.deepcopy(self.configuration)
        configuration.host = server.rstrip("/")
        return KubeConfig(
            configuration,
            source=self.source,
            new_loader=self._new_loader,
            loader=self.loader,
            exec_timeout=self.exec_timeout,
        )


def _first_current_context(merger: KubeConfigMerger) -> str:
    # kubectl's rule: the first file that sets current-context wins (the merger keeps the
    # last one).
    for path in merger.paths:
        doc = merger.config_files.get(path) or {}
        if isinstance(doc, Mapping) and doc.get("current-context"):
            return str(doc["current-context"])
    return ""


def _entries(merger: KubeConfigMerger, section: str) -> dict[str, tuple[str, Mapping[str, Any]]]:
    """``name -> (file, entry)`` of one section over the merged files; the first file to
    name an entry wins, as the merger and kubectl do."""
    found: dict[str, tuple[str, Mapping[str, Any]]] = {}
    for path in merger.paths:
        doc = merger.config_files.get(path)
        if not isinstance(doc, Mapping):
            raise ConfigError(f"kubeconfig {path}: not a mapping at the top")
        entries = doc.get(section) or []
        if not isinstance(entries, list):
            raise ConfigError(f"kubeconfig {path}: {section} is not a list")
        for i, entry in enumerate(entries):
            if not isinstance(entry, Mapping) or not entry.get("name"):
                raise ConfigError(f"kubeconfig {path}: {section}[{i}].name is missing")
            found.setdefault(str(entry["name"]), (path, entry))
    return found


def _body(entry: Mapping[str, Any], inner: str, at: str) -> Mapping[str, Any]:
    body = entry.get(inner) or {}
    if not isinstance(body, Mapping):
        raise ConfigError(f"{at} is not a mapping")
    return body


def _check_cluster(cluster: Mapping[str, Any], at: str) -> None:
    server = str(cluster.get("server") or "")
    if not server:
        raise ConfigError(f"{at}.server is missing")
    if not server.startswith(("https://", "http://")):
        raise ConfigError(f"{at}.server is {server!r}: not an https:// or http:// URL")
    insecure = cluster.get("insecure-skip-tls-verify")
    if insecure is not None and not isinstance(insecure, bool):
        raise ConfigError(f"{at}.insecure-skip-tls-verify is {insecure!r}, not true or false")
    _check_base64(cluster, "certificate-authority-data", at)
    proxy = str(cluster.get("proxy-url") or "")
    if proxy and not proxy.startswith(("http://", "https://")):
        raise ConfigError(
            f"{at}.proxy-url is {proxy!r}: only http:// and https:// proxies are supported"
        )


def _check_user(user: Mapping[str, Any], at: str) -> None:
    for field in ("client-certificate-data", "client-key-data"):
        _check_base64(user, field, at)
    has_cert = bool(user.get("client-certificate") or user.get("client-certificate-data"))
    has_key = bool(user.get("client-key") or user.get("client-key-data"))
    if has_cert != has_key:
        missing = "client-key(-data)" if has_cert else "client-certificate(-data)"
        raise ConfigError(f"{at}.{missing} is missing (a client certificate needs both)")
    plugin = user.get("exec")
    if plugin is not None:
        if not isinstance(plugin, Mapping) or not plugin.get("command"):
            raise ConfigError(f"{at}.exec.command is missing")
        if not plugin.get("apiVersion"):
            raise ConfigError(f"{at}.exec.apiVersion is missing")


def _check_base64(entry: Mapping[str, Any], field: str, at: str) -> None:
    value = entry.get(field)
    if not value:
        return
    try:
        base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(f"{at}.{field} is not base64") from None


def _guard_exec(user: Mapping[str, Any], timeout: float) -> None:
    """Run the user's exec plugin through the guard that kills it at ``timeout``.

    The entry is the merger's own dict (what the loader reads); the file is not written.
    """
    plugin = user.get("exec")
    if not isinstance(plugin, dict) or plugin.get("command") == sys.executable:
        return
    args = [str(a) for a in plugin.get("args") or []]
    plugin["args"] = [*execguard.argv(timeout), str(plugin["command"]), *args]
    plugin["command"] = sys.executable


class _TokenFile:
    """``Configuration.refresh_api_key_hook`` that reads a kubeconfig's ``tokenFile`` again
    once a minute, and at the next call after a 401 (the library reads it once, at load; a
    projected token is rotated under it). A few bytes from a local file: not worth a thread.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        # Read at the first call too: the library keeps the file's trailing newline.
        self._next = 0.0

    def expire(self) -> None:
        self._next = 0.0

    def __call__(self, configuration: Configuration) -> None:
        if time.monotonic() < self._next:
            return
        self._next = time.monotonic() + TOKEN_FILE_SECONDS
        try:
            token = Path(self.path).read_text().strip()
        except OSError:
            return  # keep the last token; the next call tries again
        if token:
            configuration.api_key["BearerToken"] = f"Bearer {token}"


class _Selected(NamedTuple):
    merger: KubeConfigMerger
    context: str
    source: str
    user: Mapping[str, Any]
    token_file: str


def _select(path: Path | str, context: str | None, exec_timeout: float) -> _Selected:
    """Read the files with the library's merger and check the chosen context's cluster and
    user (see the module's docstring for why)."""
    files = [os.path.expanduser(p) for p in str(path).split(os.pathsep) if p]
    if not files:
        raise ConfigError("kubeconfig: no file named")
    where = os.pathsep.join(files)
    if not any(os.path.exists(f) for f in files):
        raise ConfigError(f"kubeconfig {where}: no such file")
    try:
        merger = KubeConfigMerger(where)
    except yaml.YAMLError as exc:
        raise ConfigError(f"kubeconfig {where}: not valid YAML: {_one_line(exc)}") from None
    except OSError as exc:
        raise ConfigError(f"kubeconfig {where}: cannot be read: {exc.strerror}") from None
    except (AttributeError, TypeError, KeyError):
        raise ConfigError(f"kubeconfig {where}: not a kubeconfig (no mapping at the top)") from None
    clusters = _entries(merger, "clusters")
    users = _entries(merger, "users")
    contexts = _entries(merger, "contexts")
    name = context or _first_current_context(merger)
    if not name:
        raise ConfigError(f"kubeconfig {where}: current-context is not set and no context given")
    if name not in contexts:
        raise ConfigError(f"kubeconfig {where}: context {name!r} is not in contexts")
    ctx_file, ctx_entry = contexts[name]
    ctx = _body(ctx_entry, "context", f"kubeconfig {ctx_file}: contexts[{name!r}].context")
    cluster_name, user_name = str(ctx.get("cluster") or ""), str(ctx.get("user") or "")
    if cluster_name not in clusters:
        raise ConfigError(
            f"kubeconfig {ctx_file}: context {name!r} names cluster {cluster_name!r}, "
            "which is not in clusters"
        )
    if user_name and user_name not in users:
        raise ConfigError(
            f"kubeconfig {ctx_file}: context {name!r} names user {user_name!r}, "
            "which is not in users"
        )
    cluster_file, cluster_entry = clusters[cluster_name]
    at = f"kubeconfig {cluster_file}: clusters[{cluster_name!r}].cluster"
    cluster = _body(cluster_entry, "cluster", at)
    _check_cluster(cluster, at)
    _check_files(cluster, ("certificate-authority",), at, cluster_file)
    user: Mapping[str, Any] = {}
    token_file = ""
    if not user_name and isinstance(ctx, dict):
        # Anonymous: the loader reads the client certificate fields of a user entry, so it
        # gets an empty one.
        user_name = ctx["user"] = "neuron-dra-anonymous"
        assert merger.config is not None
        merger.config.value.setdefault("users", []).append({"name": user_name, "user": {}})
        users[user_name] = (ctx_file, {"name": user_name, "user": {}})
    if user_name:
        user_file, user_entry = users[user_name]
        at = f"kubeconfig {user_file}: users[{user_name!r}].user"
        user = _body(user_entry, "user", at)
        _check_user(user, at)
        _check_files(user, ("client-certificate", "client-key", "tokenFile"), at, user_file)
        _guard_exec(user, exec_timeout)
        if user.get("tokenFile") and not user.get("token") and not user.get("exec"):
            token_file = _resolve(str(user["tokenFile"]), user_file)
    return _Selected(merger, name, cluster_file, user, token_file)


def _resolve(named: str, kubeconfig: str) -> str:
    # Relative paths are relative to the file that names them, as the loader reads them.
    return os.path.join(os.path.dirname(os.path.abspath(kubeconfig)), os.path.expanduser(named))


def _check_files(entry: Mapping[str, Any], fields: tuple[str, ...], at: str, file: str) -> None:
    for field in fields:
        named = entry.get(field)
        # Inline data (a token) wins over the file, which then need not exist.
        inline = "token" if field == "tokenFile" else f"{field}-data"
        if named and not entry.get(inline):
            full = _resolve(str(named), file)
            if not os.path.isfile(full):
                raise ConfigError(f"{at}.{field}: {full} does not exist")


async def load_kubeconfig(
    path: Path | str, *, context: str | None = None, exec_timeout: float = EXEC_TIMEOUT
) -> KubeConfig:
    """The cluster and user of ``context`` (default: the first ``current-context``) in
    ``path``, which may list several files separated by ``os.pathsep`` (as ``$KUBECONFIG``
    does). Runs the exec credential plugin, if the user has one (at most ``exec_timeout``).
    """
    selected = _select(path, context, exec_timeout)
    source = selected.source
    configuration = Configuration()

    def new_loader() -> KubeConfigLoader:
        return KubeConfigLoader(
            config_dict=selected.merger.config,
            config_base_path=None,
            active_context=selected.context,
        )

    try:
        loader = new_loader()
        # The guard ends the plugin at exec_timeout; this bound is for the loader itself.
        async with asyncio.timeout(exec_timeout + 10):
            await loader.load_and_set(configuration)
    except TimeoutError:
        raise ConfigError(
            f"kubeconfig {source}: the exec credential plugin did not answer in "
            f"{exec_timeout:.0f} s"
        ) from None
    except (ConfigException, ValueError, OSError, KeyError, TypeError, AssertionError) as exc:
        raise ConfigError(f"kubeconfig {source}: {_one_line(exc)}") from None
    if selected.token_file:
        configuration.refresh_api_key_hook = _TokenFile(selected.token_file)
    if not selected.user.get("exec"):
        return KubeConfig(configuration, source=source, exec_timeout=exec_timeout)
    return KubeConfig(
        configuration,
        source=source,
        new_loader=new_loader,
        loader=loader,
        exec_timeout=exec_timeout,
    )


def load_in_cluster(
    *, env: Mapping[str, str] | None = None, account_dir: Path = SERVICE_ACCOUNT_DIR
) -> KubeConfig:
    """The pod's own access: ``KUBERNETES_SERVICE_HOST``/``_PORT``, the service account's
    token (read again once a minute by the library's hook, as the kubelet rotates it) and
    the cluster's CA."""
    env = dict(os.environ if env is None else env)
    if not env.get("KUBERNETES_SERVICE_HOST") or not env.get("KUBERNETES_SERVICE_PORT"):
        raise ConfigError(
            "in-cluster config: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must both "
            "be set (they are in a pod)"
        )
    token, ca = account_dir / "token", account_dir / "ca.crt"
    for what in (token, ca):
        if not what.is_file():
            raise ConfigError(f"in-cluster config: {what} does not exist (no service account?)")
    configuration = Configuration()
    loader = InClusterConfigLoader(token_filename=str(token), cert_filename=str(ca), environ=env)
    try:
        loader.load_and_set(configuration)
    except (ConfigException, OSError) as exc:
        raise ConfigError(f"in-cluster config {account_dir}: {_one_line(exc)}") from None
    return KubeConfig(configuration, source=str(account_dir))
