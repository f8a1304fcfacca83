"""``neuron-dra-bus-secrets``, as the base's install Job runs it, against a real apiserver with
the Job's own ServiceAccount and Role from the rendered base: it makes the bus's two Secrets
when missing, keeps them when present, and may do nothing else with Secrets. A real NATS
server then speaks TLS with the certificate it made, which a client trusting its ca.crt
accepts under the name every client dials."""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import nats
import pytest
import yaml

from tests.fixtures.nats import NatsServer
from tests.fixtures.stack import KubeStack
from tests.unit.deploy.test_kustomize import KUSTOMIZE, render

ACCOUNT = "neuron-dra-bus-secrets"
SECRETS = ("neuron-dra-bus-auth", "neuron-dra-nats-tls")


def _job_identity(stack: KubeStack, tmp_path: Path) -> tuple[str, Path]:
    """A namespace of its own with the base's ServiceAccount, Role and RoleBinding of the Job;
    returns the namespace and a kubeconfig with a token of that ServiceAccount."""
    namespace = f"bus-secrets-{uuid.uuid4().hex[:6]}"
    stack.create_namespace(namespace)
    docs = [
        d
        for d in render(KUSTOMIZE / "base")
        if d["metadata"]["name"] == ACCOUNT and d["kind"] != "Job"
    ]
    assert sorted(d["kind"] for d in docs) == ["Role", "RoleBinding", "ServiceAccount"]
    for d in docs:
        d["metadata"]["namespace"] = namespace
        for subject in d.get("subjects", ()):
            subject["namespace"] = namespace
    stack.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    token = stack.kubectl("create", "token", ACCOUNT, "-n", namespace).stdout.strip()
    admin = yaml.safe_load(stack.kubeconfig.read_text())
    cluster = admin["clusters"][0]["cluster"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": ACCOUNT, "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": ACCOUNT}}],
        "current-context": "c",
    }
    path = tmp_path / "job.kubeconfig"
    path.write_text(json.dumps(config))
    return namespace, path


def _run(kubeconfig: Path, namespace: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NEURON_DRA_")}
    return subprocess.run(
        [sys.executable, "-m", "neuron_dra_bus_auth.install"],
        env={**clean, "NEURON_DRA_KUBECONFIG": str(kubeconfig), "NEURON_DRA_NAMESPACE": namespace},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _secret(stack: KubeStack, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = stack.get_json("secret", name, "-n", namespace)
    return found


@pytest.fixture
def made(kube_stack: KubeStack, tmp_path: Path) -> tuple[str, Path]:
    namespace, kubeconfig = _job_identity(kube_stack, tmp_path)
    first = _run(kubeconfig, namespace)
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == [f"Secret {namespace}/{s}: created" for s in SECRETS]
    return namespace, kubeconfig


def test_the_job_makes_both_secrets_once_and_keeps_them(
    kube_stack: KubeStack, made: tuple[str, Path]
) -> None:
    namespace, kubeconfig = made
    before = {s: _secret(kube_stack, namespace, s)["data"] for s in SECRETS}
    assert set(before["neuron-dra-bus-auth"]) == {"issuer.nk", "issuer.pub", "password"}
    assert set(before["neuron-dra-nats-tls"]) == {"ca.crt", "tls.crt", "tls.key"}
    assert _secret(kube_stack, namespace, "neuron-dra-nats-tls")["type"] == "kubernetes.io/tls"
    again = _run(kubeconfig, namespace)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == [f"Secret {namespace}/{s}: kept" for s in SECRETS]
    assert {s: _secret(kube_stack, namespace, s)["data"] for s in SECRETS} == before


def test_the_jobs_identity_may_create_secrets_and_nothing_else(
    kube_stack: KubeStack, made: tuple[str, Path]
) -> None:
    namespace, kubeconfig = made
    whoami = f"system:serviceaccount:{namespace}:{ACCOUNT}"
    for verb in ("get", "list", "watch", "update", "patch", "delete"):
        answer = kube_stack.kubectl(
            "auth", "can-i", verb, "secrets", "-n", namespace, "--as", whoami, check=False
        )
        assert answer.stdout.strip() == "no", (verb, answer.stdout)
    # Refused by the apiserver when it tries, and the Secret is as it was.
    read = kube_stack.kubectl(
        f"--kubeconfig={kubeconfig}", "get", "secret", SECRETS[0], "-n", namespace, check=False
    )
    assert read.returncode != 0
    assert "forbidden" in read.stderr.lower()
    elsewhere = kube_stack.kubectl(
        "auth", "can-i", "create", "secrets", "-n", "default", "--as", whoami, check=False
    )
    assert elsewhere.stdout.strip() == "no"


async def test_nats_speaks_tls_with_the_certificate_the_job_made(
    kube_stack: KubeStack, made: tuple[str, Path], tmp_path: Path
) -> None:
    namespace, _ = made
    data = _secret(kube_stack, namespace, "neuron-dra-nats-tls")["data"]
    for name, value in data.items():
        (tmp_path / name).write_bytes(base64.b64decode(value))
    config = tmp_path / "tls.conf"
    config.write_text(
        f'tls {{\n  cert_file: "{tmp_path / "tls.crt"}"\n  key_file: "{tmp_path / "tls.key"}"\n}}\n'
    )
    store = tmp_path / "js"
    store.mkdir()
    server = NatsServer(store_dir=store, log_file=tmp_path / "nats.log", config=config)
    server.start()
    try:
        trusting = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
        nc = await nats.connect(
            server.url, tls=trusting, tls_hostname="nats.neuron-dra-driver.svc", connect_timeout=5
        )
        assert nc.is_connected
        await nc.close()
        # A client that trusts other CAs only is turned away at the handshake.
        with pytest.raises(Exception, match=r"(?i)certificate"):
            await nats.connect(
                server.url,
                tls=ssl.create_default_context(),
                tls_hostname="nats.neuron-dra-driver.svc",
                connect_timeout=5,
                allow_reconnect=False,
                max_reconnect_attempts=0,
            )
    finally:
        server.stop()
