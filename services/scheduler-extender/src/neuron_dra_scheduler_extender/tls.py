"""The verbs' TLS: a server context that requires a client certificate signed by the
configured CA, built from the settings with the standard library's ``ssl``.

Only kube-scheduler holds such a certificate (``tlsConfig.certFile`` in its
KubeSchedulerConfiguration), so only it can ask the extender to bind a pod: a client with no
certificate, or one signed by another CA (a node's kubelet certificate from the cluster CA,
say), is refused during the handshake, before a byte of HTTP is read.
"""

from __future__ import annotations

import logging
import ssl

from neuron_dra_common.settings import SettingsError, env_name, flag_name

from neuron_dra_scheduler_extender.settings import ExtenderSettings

__all__ = ["server_context"]

log = logging.getLogger(__name__)

_FILES = ("tls_cert", "tls_key", "tls_client_ca")


def _setting(field: str) -> str:
    return f"{env_name(field)} ({flag_name(field)})"


def _readable(field: str, path: str) -> None:
    if not path:
        raise SettingsError(
            f"{_setting(field)} is empty: the verbs are served over HTTPS with client "
            f"certificates only; set {', '.join(env_name(f) for f in _FILES)} (or "
            f"{env_name('verbs_insecure_http')}=true, for debugging only)"
        )
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise SettingsError(f"{_setting(field)}={path!r}: {exc.strerror or exc}") from None


def server_context(settings: ExtenderSettings) -> ssl.SSLContext | None:
    """The verbs' TLS context, or None in the insecure debugging mode (said loudly).

    Raises :class:`SettingsError` naming the setting of a missing, unreadable or bad file.
    """
    if settings.verbs_insecure_http:
        log.warning(
            "INSECURE: the extender verbs are served over plain HTTP with no client "
            "authentication; anyone who reaches the port can bind any pending Neuron pod to "
            "any node. For debugging only.",
            extra={"setting": env_name("verbs_insecure_http"), "port": settings.verbs_port},
        )
        return None
    for field in _FILES:
        _readable(field, getattr(settings, field))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.verify_mode = ssl.CERT_REQUIRED
    try:
        context.load_verify_locations(cafile=settings.tls_client_ca)
    except (ssl.SSLError, ValueError) as exc:
        raise SettingsError(
            f"{_setting('tls_client_ca')}={settings.tls_client_ca!r}: not a PEM CA bundle ({exc})"
        ) from None
    try:
        context.load_cert_chain(settings.tls_cert, settings.tls_key)
    except ssl.SSLError as exc:
        raise SettingsError(
            f"{_setting('tls_cert')}={settings.tls_cert!r} and {_setting('tls_key')}="
            f"{settings.tls_key!r}: not a PEM certificate and its key ({exc.reason or exc})"
        ) from None
    if not context.get_ca_certs():
        raise SettingsError(
            f"{_setting('tls_client_ca')}={settings.tls_client_ca!r}: holds no CA certificate"
        )
    return context
