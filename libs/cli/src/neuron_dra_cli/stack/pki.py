"""The local stack's PKI: one CA, the apiserver's serving certificate, a client
certificate per component and per node, and the service-account signing key.

Node certificates carry ``CN=system:node:<name>, O=system:nodes`` so that the Node
authorizer and the NodeRestriction admission plugin limit each simulated kubelet exactly
as on a real cluster. Files are created once and reused; only missing ones are made.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = dt.timedelta(days=3650)
SERVICE_IP = "10.0.0.1"


@dataclass(frozen=True)
class CertPair:
    cert: Path
    key: Path


def _write_private(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    tmp.replace(path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _load_key(path: Path) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{path}: expected an EC private key")
    return key


class Pki:
    """Certificates under ``<state>/pki``; every method is idempotent."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.ca = self._ensure_ca()

    def _ensure_ca(self) -> CertPair:
        pair = CertPair(self.root / "ca.crt", self.root / "ca.key")
        if pair.cert.exists() and pair.key.exists():
            return pair
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "neuron-dra-local-ca")])
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        _write_private(pair.key, _key_pem(key))
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return pair

    def _issue(
        self,
        stem: str,
        *,
        common_name: str,
        organizations: tuple[str, ...] = (),
        server_names: tuple[str, ...] = (),
        server_ips: tuple[str, ...] = (),
        client: bool = True,
    ) -> CertPair:
        pair = CertPair(self.root / f"{stem}.crt", self.root / f"{stem}.key")
        if pair.cert.exists() and pair.key.exists():
            return pair
        ca_key = _load_key(self.ca.key)
        ca_cert = x509.load_pem_x509_certificate(self.ca.cert.read_bytes())
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
        if server_names or server_ips:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        now = dt.datetime.now(dt.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        if server_names or server_ips:
            sans: list[x509.GeneralName] = [x509.DNSName(n) for n in server_names]
            sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in server_ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        _write_private(pair.key, _key_pem(key))
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return pair

    def apiserver(self) -> CertPair:
        return self._issue(
            "apiserver",
            common_name="kube-apiserver",
            server_names=(
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
            server_ips=("127.0.0.1", SERVICE_IP),
            client=False,
        )

    def nats(self) -> CertPair:
        """NATS's certificate (the authenticated bus speaks TLS): a server's, and a client's
        too, as a server of a cluster shows it on the routes it opens to the others."""
        return self._issue(
            "nats",
            common_name="neuron-dra-nats",
            server_names=("localhost",),
            server_ips=("127.0.0.1",),
        )

    def scheduler_extender(self) -> CertPair:
        """The scheduler extender's serving certificate: its verbs speak HTTPS only, and the
        scheduler checks this for the Service's name (``tlsConfig.serverName``)."""
        return self._issue(
            "scheduler-extender",
            common_name="neuron-dra-scheduler-extender",
            server_names=("localhost", "neuron-dra-scheduler-extender.neuron-dra-driver.svc"),
            server_ips=("127.0.0.1",),
            client=False,
        )

    def client(self, stem: str, *, user: str, groups: tuple[str, ...] = ()) -> CertPair:
        """A client certificate for ``user`` in ``groups`` (file stem ``stem``)."""
        return self._issue(stem, common_name=user, organizations=groups)

    def node(self, node_name: str) -> CertPair:
        """The kubelet client certificate of one node."""
        return self.client(
            f"node-{node_name}", user=f"system:node:{node_name}", groups=("system:nodes",)
        )

    def kubelet_serving(self, node_name: str, *, ip: str) -> CertPair:
        """The serving certificate of a real node's kubelet at ``ip`` (the apiserver checks
        it against the CA for `kubectl logs` and `exec`)."""
        return self._issue(
            f"kubelet-serving-{node_name}",
            common_name=f"system:node:{node_name}",
            server_names=(node_name,),
            server_ips=(ip, "127.0.0.1"),
            client=False,
        )

    def service_account_key(self) -> tuple[Path, Path]:
        """The (private, public) PEM files that sign and verify service-account tokens."""
        private, public = self.root / "sa.key", self.root / "sa.pub"
        if not (private.exists() and public.exists()):
            key = ec.generate_private_key(ec.SECP256R1())
            _write_private(private, _key_pem(key))
            public.write_bytes(
                key.public_key().public_bytes(
                    serialization.Encoding.PEM,
                    serialization.PublicFormat.SubjectPublicKeyInfo,
                )
            )
        return private, public


def write_kubeconfig(
    path: Path, *, server: str, ca: Path, pair: CertPair, user: str, context: str = "neuron-dra"
) -> Path:
    """A kubeconfig that reaches ``server`` as the owner of ``pair`` (absolute file paths)."""
    import yaml

    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": context,
                "cluster": {"server": server, "certificate-authority": str(ca.resolve())},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate": str(pair.cert.resolve()),
                    "client-key": str(pair.key.resolve()),
                },
            }
        ],
        "contexts": [{"name": context, "context": {"cluster": context, "user": user}}],
        "current-context": context,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
    tmp.replace(path)
    return path
