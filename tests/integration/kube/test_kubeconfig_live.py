"""The client's own config loading against the real apiserver: the stack's certificate
kubeconfig, the same with inline data, a bearer token, and a pod's service-account view;
each is checked by asking the apiserver who the caller is."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import yaml
from neuron_dra_common.kube import (
    KubeClient,
    Resource,
    connect,
    load_in_cluster,
    load_kubeconfig,
)

from tests.fixtures.stack import KubeStack

pytestmark = pytest.mark.stack

NS = "default"
SELF_SUBJECT_REVIEWS = Resource(
    group="authentication.k8s.io", version="v1", plural="selfsubjectreviews"
)
ACCOUNT = "kubeconfig-probe"


def read(path: str) -> bytes:
    return Path(path).read_bytes()


async def who(client: KubeClient) -> str:
    review = await client.create(
        SELF_SUBJECT_REVIEWS,
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )
    return str(review["status"]["userInfo"]["username"])


@pytest.fixture(scope="module")
def account_token(kube_stack: KubeStack) -> str:
    kube_stack.kubectl("create", "serviceaccount", ACCOUNT, "-n", NS, check=False)
    return kube_stack.kubectl("create", "token", ACCOUNT, "-n", NS).stdout.strip()


async def test_the_stacks_kubeconfig_authenticates_by_certificate(kube_stack: KubeStack) -> None:
    client = await connect(kubeconfig=kube_stack.kubeconfig)
    try:
        assert await who(client) == "kubernetes-admin"
    finally:
        await client.close()


async def test_inline_certificates(kube_stack: KubeStack, tmp_path: Path) -> None:
    doc: dict[str, Any] = yaml.safe_load(kube_stack.kubeconfig.read_text())
    cluster, user = doc["clusters"][0]["cluster"], doc["users"][0]["user"]
    for field in ("certificate-authority", "client-certificate", "client-key"):
        holder = cluster if field == "certificate-authority" else user
        holder[f"{field}-data"] = base64.b64encode(read(holder.pop(field))).decode()
    path = tmp_path / "inline"
    path.write_text(yaml.safe_dump(doc))
    client = await connect(kubeconfig=path)
    try:
        assert await who(client) == "kubernetes-admin"
    finally:
        await client.close()


async def test_a_bearer_token(kube_stack: KubeStack, account_token: str, tmp_path: Path) -> None:
    doc: dict[str, Any] = yaml.safe_load(kube_stack.kubeconfig.read_text())
    doc["users"][0]["user"] = {"token": account_token}
    path = tmp_path / "token"
    path.write_text(yaml.safe_dump(doc))
    client = await connect(kubeconfig=path)
    try:
        assert await who(client) == f"system:serviceaccount:{NS}:{ACCOUNT}"
    finally:
        await client.close()


async def test_in_cluster_view(kube_stack: KubeStack, account_token: str, tmp_path: Path) -> None:
    """What a pod sees: the service's address in the environment, the mounted token and CA."""
    admin = await load_kubeconfig(kube_stack.kubeconfig)
    host, _, port = admin.server.removeprefix("https://").rpartition(":")
    (tmp_path / "token").write_text(account_token)
    (tmp_path / "ca.crt").write_bytes(read(admin.ca_file))
    config = load_in_cluster(
        env={"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port},
        account_dir=tmp_path,
    )
    client = KubeClient(config)
    try:
        assert await who(client) == f"system:serviceaccount:{NS}:{ACCOUNT}"
    finally:
        await client.close()
