"""How a process proves who it is to NATS, and the TLS it speaks: from its settings.

The token is a projected ServiceAccount token that the kubelet rotates on disk, so it is read
again at every (re)connect rather than once; the auth callout checks it with a TokenReview.
With nothing set the connection is as before: no credentials, plain TCP.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import msgspec

from neuron_dra_common.settings import ServiceSettings

__all__ = ["BusCredentials", "credentials_of"]


class BusCredentials(msgspec.Struct, frozen=True, kw_only=True):
    """``token_file``: sent as the auth token, re-read at each connect. ``user`` and
    ``password_file``: a user of the server's config (the auth callout's own user).
    ``tls_ca``: trust these CAs (turns TLS on); ``tls_cert``/``tls_key``: a client certificate.
    """

    token_file: str = ""
    user: str = ""
    password_file: str = ""
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""

    def token(self) -> str:
        """The token as it is on disk now; the error names the file."""
        try:
            token = Path(self.token_file).read_text().strip()
        except OSError as exc:
            raise RuntimeError(f"NATS token file {self.token_file}: {exc.strerror}") from None
        if not token:
            raise RuntimeError(f"NATS token file {self.token_file}: empty")
        return token

    def password(self) -> str:
        try:
            return Path(self.password_file).read_text().strip()
        except OSError as exc:
            raise RuntimeError(f"NATS password file {self.password_file}: {exc.strerror}") from None

    def tls(self) -> ssl.SSLContext | None:
        """A client TLS context when a CA or a client certificate is set, else None."""
        if not (self.tls_ca or self.tls_cert):
            return None
        context = ssl.create_default_context(cafile=self.tls_ca or None)
        if self.tls_cert:
            context.load_cert_chain(self.tls_cert, self.tls_key or None)
        return context


def credentials_of(settings: ServiceSettings) -> BusCredentials:
    """The credentials a service was configured with (``NEURON_DRA_NATS_*``)."""
    return BusCredentials(
        token_file=settings.nats_token_file,
        tls_ca=settings.nats_tls_ca,
        tls_cert=settings.nats_tls_cert,
        tls_key=settings.nats_tls_key,
    )
