"""``neuron-dra-bus-secrets``: the authenticated bus's two Secrets, made at install when missing.

The base's ``neuron-dra-bus-secrets`` Job runs it, so ``kubectl apply -k`` installs the
authenticated bus with no step by hand:

- ``neuron-dra-bus-auth``: the callout's issuer key and NATS password (``neuron-dra-bus-auth-keys``);
- ``neuron-dra-nats-tls``: a CA of the installation's own and NATS's certificate signed by it
  (``ca.crt``, ``tls.crt``, ``tls.key``, the layout cert-manager writes), naming the address
  every client dials and the servers' own addresses (cluster routes), for server and client use.

Each is created, never replaced: one that exists (made by an earlier run, by cert-manager or by
hand) is kept as it is, so a second run changes nothing. Its only API right is ``create`` on
``secrets`` in its namespace; "already exists" is how it learns a Secret is there. The CA's key
is not kept: a new certificate comes from a new CA (delete the Secret ``neuron-dra-nats-tls``
and run the Job again; every pod reads the new ``ca.crt`` from its projected volume).
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import sys
from collections.abc import Callable, Sequence
from typing import Annotated, Final

import msgspec
from neuron_dra_common.settings import SettingsError, load

__all__ = ["TLS_SECRET", "InstallSettings", "ensure_secrets", "main", "nats_tls"]

PROG: Final = "neuron-dra-bus-secrets"
TLS_SECRET: Final = "neuron-dra-nats-tls"


class InstallSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Where to make the Secrets and what NATS's certificate names."""

    kubeconfig: Annotated[
        str, msgspec.Meta(description="kubeconfig file; empty: KUBECONFIG, else in-cluster")
    ] = ""
    namespace: Annotated[
        str, msgspec.Meta(min_length=1, description="Namespace of NATS and of the Secrets")
    ] = "neuron-dra-driver"
    nats_names: Annotated[
        tuple[str, ...],
        msgspec.Meta(
            min_length=1,
            description="DNS names NATS's certificate carries, comma-separated: the Service "
            "every client dials and the servers' own (cluster routes)",
        ),
    ] = (
        "nats.neuron-dra-driver.svc",
        "nats.neuron-dra-driver.svc.cluster.local",
        "*.nats-cluster.neuron-dra-driver.svc",
        "*.nats-cluster.neuron-dra-driver.svc.cluster.local",
    )
    certificate_days: Annotated[
        int, msgspec.Meta(ge=1, le=3650, description="Days NATS's certificate is valid")
    ] = 825


def nats_tls(names: Sequence[str], *, days: int) -> dict[str, bytes]:
    """A new CA and NATS's certificate and key it signs: ``ca.crt``, ``tls.crt``, ``tls.key``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "neuron-dra-nats-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days + 1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    return {
        "ca.crt": ca.public_bytes(pem),
        "tls.crt": cert.public_bytes(pem),
        "tls.key": key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    }


def _tls_manifest(files: dict[str, bytes], *, namespace: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": TLS_SECRET, "namespace": namespace},
        "type": "kubernetes.io/tls",
        "data": {k: base64.b64encode(v).decode() for k, v in files.items()},
    }


async def ensure_secrets(settings: InstallSettings) -> dict[str, str]:
    """Create each Secret that is missing; return ``{name: "created" | "kept"}``."""
    from neuron_dra_common.kube import ApiException, Resource, connect

    from neuron_dra_bus_auth import keys

    secrets = Resource(group="", version="v1", plural="secrets", kind="Secret", namespaced=True)

    def auth_keys() -> dict[str, object]:
        return keys.secret_manifest(keys.new_keys(), namespace=settings.namespace)

    def nats_certificate() -> dict[str, object]:
        made = nats_tls(settings.nats_names, days=settings.certificate_days)
        return _tls_manifest(made, namespace=settings.namespace)

    wanted: dict[str, Callable[[], dict[str, object]]] = {
        keys.SECRET_NAME: auth_keys,
        TLS_SECRET: nats_certificate,
    }
    kube = await connect(kubeconfig=settings.kubeconfig or None)
    done: dict[str, str] = {}
    try:
        for name, make in wanted.items():
            try:
                await kube.create(secrets, make())
            except ApiException as exc:
                if exc.status != 409:  # anything but "already exists" is a failure
                    raise RuntimeError(f"Secret {settings.namespace}/{name}: {exc}") from None
                done[name] = "kept"
            else:
                done[name] = "created"
    finally:
        await kube.close()
    return done


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = load(InstallSettings, argv=sys.argv[1:] if argv is None else argv, prog=PROG)
    except SettingsError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    try:
        done = asyncio.run(ensure_secrets(settings))
    except Exception as exc:  # one line naming the Secret or the kubeconfig
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    for name, what in done.items():
        print(f"Secret {settings.namespace}/{name}: {what}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
