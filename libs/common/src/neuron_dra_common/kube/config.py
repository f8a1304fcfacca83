"""Where the API is and how to authenticate: a kubeconfig file, or the pod's service account.

Reads the parts of a kubeconfig a client needs (the current context's cluster and user:
``server``, ``certificate-authority(-data)``, ``insecure-skip-tls-verify``,
``tls-server-name``, ``proxy-url``, ``client-certificate(-data)`` / ``client-key(-data)``,
``token``, ``tokenFile``, ``exec``) and nothing else. Relative paths are relative to the
file that names them, as kubectl reads them. Errors name the file and the field.

>>> config = load_kubeconfig("/etc/kubernetes/admin.conf")  # doctest: +SKIP
>>> config.server
'https://10.0.0.1:6443'
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import ssl
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import msgspec

from neuron_dra_common.errors import SetupError

__all__ = [
    "SERVICE_ACCOUNT_DIR",
    "ConfigError",
    "ExecCommand",
    "KubeConfig",
    "load_in_cluster",
    "load_kubeconfig",
    "ssl_context",
]

#: Where Kubernetes mounts a pod's service-account token, CA and namespace.
SERVICE_ACCOUNT_DIR: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class ConfigError(SetupError):
    """A kubeconfig (or the pod's service account) that cannot be used; says where and why."""


class ExecCommand(msgspec.Struct, frozen=True, kw_only=True):
    """A credential plugin (``users[].user.exec``), e.g. ``aws eks get-token``."""

    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    api_version: str = "client.authentication.k8s.io/v1"


class KubeConfig(msgspec.Struct, frozen=True, kw_only=True):
    """How to reach one apiserver. ``source`` names where it was read (for errors)."""

    server: str
    source: str
    ca_file: str = ""
    ca_data: bytes = b""
    insecure: bool = False
    tls_server_name: str = ""
    proxy_url: str = ""
    cert_file: str = ""
    key_file: str = ""
    cert_data: bytes = b""
    key_data: bytes = b""
    token: str = ""
    token_file: str = ""
    exec: ExecCommand | None = None

    def with_server(self, server: str) -> KubeConfig:
        """The same credentials for another address (a relay, a port-forward)."""
        return msgspec.structs.replace(self, server=server)


def load_kubeconfig(path: Path | str, *, context: str | None = None) -> KubeConfig:
    """The cluster and user of ``context`` (default: ``current-context``) in ``path``.

    ``path`` may list several files separated by ``os.pathsep`` (as ``$KUBECONFIG`` does):
    the first file to define a name wins, and the first ``current-context`` counts.
    """
    files = [Path(p) for p in str(path).split(os.pathsep) if p]
    if not files:
        raise ConfigError("kubeconfig: no file named")
    merged: dict[str, dict[str, tuple[Path, Mapping[str, Any]]]] = {
        "clusters": {},
        "users": {},
        "contexts": {},
    }
    current = ""
    for file in files:
        doc = _read_yaml(file, must_exist=len(files) == 1)
        if doc is None:
            continue
        current = current or str(doc.get("current-context") or "")
        for section, inner in (("clusters", "cluster"), ("users", "user"), ("contexts", "context")):
            entries = doc.get(section) or []
            if not isinstance(entries, list):
                raise ConfigError(f"kubeconfig {file}: {section} is not a list")
            for i, entry in enumerate(entries):
                if not isinstance(entry, Mapping) or not entry.get("name"):
                    raise ConfigError(f"kubeconfig {file}: {section}[{i}].name is missing")
                body = entry.get(inner) or {}
                if not isinstance(body, Mapping):
                    raise ConfigError(f"kubeconfig {file}: {section}[{i}].{inner} is not a mapping")
                merged[section].setdefault(str(entry["name"]), (file, body))
    where = os.pathsep.join(str(f) for f in files)
    name = context or current
    if not name:
        raise ConfigError(f"kubeconfig {where}: current-context is not set and no context given")
    if name not in merged["contexts"]:
        raise ConfigError(f"kubeconfig {where}: context {name!r} is not in contexts")
    ctx_file, ctx = merged["contexts"][name]
    cluster_name = str(ctx.get("cluster") or "")
    if cluster_name not in merged["clusters"]:
        raise ConfigError(
            f"kubeconfig {ctx_file}: context {name!r} names cluster {cluster_name!r}, "
            "which is not in clusters"
        )
    user_name = str(ctx.get("user") or "")
    if user_name and user_name not in merged["users"]:
        raise ConfigError(
            f"kubeconfig {ctx_file}: context {name!r} names user {user_name!r}, "
            "which is not in users"
        )
    cluster_file, cluster = merged["clusters"][cluster_name]
    user_file, user = merged["users"][user_name] if user_name else (ctx_file, {})
    at = f"kubeconfig {cluster_file}: clusters[{cluster_name!r}].cluster"
    server = str(cluster.get("server") or "")
    if not server:
        raise ConfigError(f"{at}.server is missing")
    if not server.startswith(("https://", "http://")):
        raise ConfigError(f"{at}.server is {server!r}: not an https:// or http:// URL")
    fields: dict[str, Any] = {
        "server": server.rstrip("/"),
        "source": str(cluster_file),
        "ca_file": _path(cluster_file, cluster.get("certificate-authority")),
        "ca_data": _b64(
            cluster.get("certificate-authority-data"), f"{at}.certificate-authority-data"
        ),
        "insecure": _bool(
            cluster.get("insecure-skip-tls-verify"), f"{at}.insecure-skip-tls-verify"
        ),
        "tls_server_name": str(cluster.get("tls-server-name") or ""),
        "proxy_url": str(cluster.get("proxy-url") or ""),
    }
    at = f"kubeconfig {user_file}: users[{user_name!r}].user"
    for unsupported in ("auth-provider", "username"):
        if user.get(unsupported):
            raise ConfigError(
                f"{at}.{unsupported} is not supported; use a token, a client certificate "
                "or an exec credential plugin"
            )
    fields |= {
        "cert_file": _path(user_file, user.get("client-certificate")),
        "key_file": _path(user_file, user.get("client-key")),
        "cert_data": _b64(user.get("client-certificate-data"), f"{at}.client-certificate-data"),
        "key_data": _b64(user.get("client-key-data"), f"{at}.client-key-data"),
        "token": str(user.get("token") or ""),
        "token_file": _path(user_file, user.get("tokenFile")),
        "exec": _exec(user.get("exec"), at=f"{at}.exec"),
    }
    has_cert = bool(fields["cert_file"] or fields["cert_data"])
    has_key = bool(fields["key_file"] or fields["key_data"])
    if has_cert != has_key:
        missing = "client-key(-data)" if has_cert else "client-certificate(-data)"
        raise ConfigError(f"{at}.{missing} is missing (a client certificate needs both)")
    config = KubeConfig(**fields)
    cluster_at = f"kubeconfig {cluster_file}: clusters[{cluster_name!r}].cluster"
    for where_field, named in (
        (f"{cluster_at}.certificate-authority", config.ca_file),
        (f"{at}.client-certificate", config.cert_file),
        (f"{at}.client-key", config.key_file),
        (f"{at}.tokenFile", config.token_file),
    ):
        if named and not Path(named).is_file():
            raise ConfigError(f"{where_field}: {named} does not exist")
    return config


def load_in_cluster(
    *, env: Mapping[str, str] | None = None, account_dir: Path = SERVICE_ACCOUNT_DIR
) -> KubeConfig:
    """The pod's own access: ``KUBERNETES_SERVICE_HOST``/``_PORT``, the service account's
    token (re-read as the kubelet rotates it) and the cluster's CA."""
    env = os.environ if env is None else env
    host = env.get("KUBERNETES_SERVICE_HOST", "")
    port = env.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise ConfigError(
            "in-cluster config: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must both "
            "be set (they are in a pod)"
        )
    token, ca = account_dir / "token", account_dir / "ca.crt"
    for what in (token, ca):
        if not what.is_file():
            raise ConfigError(f"in-cluster config: {what} does not exist (no service account?)")
    # An IPv6 service address needs brackets in a URL.
    netloc = f"[{host}]" if ":" in host else host
    return KubeConfig(
        server=f"https://{netloc}:{port}",
        source=str(account_dir),
        ca_file=str(ca),
        token_file=str(token),
    )


def ssl_context(config: KubeConfig) -> ssl.SSLContext:
    """TLS for ``config``: its CA (else the system's), its client certificate, if any."""
    context = ssl.create_default_context(cafile=config.ca_file or None)
    if config.ca_data:
        try:
            context.load_verify_locations(cadata=config.ca_data.decode("ascii"))
        except (ssl.SSLError, UnicodeDecodeError) as exc:
            raise ConfigError(
                f"kubeconfig {config.source}: certificate-authority-data is not a PEM "
                f"certificate: {exc}"
            ) from None
    if config.insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if config.cert_file or config.cert_data:
        _load_client_cert(context, config)
    return context


def _load_client_cert(context: ssl.SSLContext, config: KubeConfig) -> None:
    # ``load_cert_chain`` reads files only: inline data goes through a private directory
    # that is removed as soon as the key is loaded.
    with tempfile.TemporaryDirectory(prefix="kubeconfig-") as tmp:
        cert, key = config.cert_file, config.key_file
        if config.cert_data:
            cert = _private_file(Path(tmp) / "client.crt", config.cert_data)
        if config.key_data:
            key = _private_file(Path(tmp) / "client.key", config.key_data)
        try:
            context.load_cert_chain(cert, key)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(
                f"kubeconfig {config.source}: the client certificate and key cannot be "
                f"loaded: {exc}"
            ) from None


def _private_file(path: Path, data: bytes) -> str:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return str(path)


def _read_yaml(path: Path, *, must_exist: bool) -> Mapping[str, Any] | None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        if must_exist:
            raise ConfigError(f"kubeconfig {path}: no such file") from None
        return None
    except OSError as exc:
        raise ConfigError(f"kubeconfig {path}: cannot be read: {exc.strerror}") from None
    doc: Any = None
    parsed = False
    if text.lstrip().startswith("{"):
        # A kubeconfig written as JSON (which is YAML) needs no YAML parser; one in YAML's
        # flow style, or JSON with a comment after it, is still YAML.
        with contextlib.suppress(msgspec.DecodeError):
            doc, parsed = msgspec.json.decode(text), True
    if not parsed:
        import yaml  # only a YAML kubeconfig needs it; a pod's own account does not

        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"kubeconfig {path}: not valid YAML: {exc}") from None
    if doc is None:
        return {}
    if not isinstance(doc, Mapping):
        raise ConfigError(f"kubeconfig {path}: not a mapping at the top")
    return doc


def _path(file: Path, value: object) -> str:
    if not value:
        return ""
    path = Path(str(value)).expanduser()
    return str(path if path.is_absolute() else file.parent / path)


def _b64(value: object, where: str) -> bytes:
    if not value:
        return b""
    try:
        return base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(f"{where} is not base64") from None


def _bool(value: object, where: str) -> bool:
    if value is None or isinstance(value, bool):
        return bool(value)
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ConfigError(f"{where} is {value!r}, not true or false")


def _exec(value: object, *, at: str) -> ExecCommand | None:
    if not value:
        return None
    if not isinstance(value, Mapping) or not value.get("command"):
        raise ConfigError(f"{at}.command is missing")
    args = value.get("args") or []
    env = value.get("env") or []
    if not isinstance(args, Sequence) or isinstance(args, str):
        raise ConfigError(f"{at}.args is not a list")
    if not isinstance(env, Sequence) or isinstance(env, str):
        raise ConfigError(f"{at}.env is not a list")
    pairs: list[tuple[str, str]] = []
    for i, item in enumerate(env):
        if not isinstance(item, Mapping) or "name" not in item:
            raise ConfigError(f"{at}.env[{i}].name is missing")
        pairs.append((str(item["name"]), str(item.get("value", ""))))
    return ExecCommand(
        command=str(value["command"]),
        args=tuple(str(a) for a in args),
        env=tuple(pairs),
        api_version=str(value.get("apiVersion") or "client.authentication.k8s.io/v1"),
    )
