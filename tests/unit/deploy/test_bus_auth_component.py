"""The bus-auth component, as an overlay that lists it renders: every service presents a
projected token of its own ServiceAccount for the bus's audience, that account has a bus
identity, the callout may only review tokens, the server reads the callout's keys from the
Secret `neuron-dra-bus-auth-keys` makes, and only the declare Job holds the admin identity."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from neuron_dra_bus_auth import keys
from neuron_dra_bus_auth.identities import service_account_of
from neuron_dra_bus_auth.permissions import CLUSTER_SERVICES, NODE_AGENTS, Role

from tests.unit.deploy.test_hardening import locked_down
from tests.unit.deploy.test_kustomize import KUSTOMIZE, by_kind, render

Docs = list[dict[str, Any]]
WORKLOAD_KINDS = ("Deployment", "DaemonSet", "StatefulSet", "Job")


def with_bus_auth(folder: Path, overlay: str) -> Docs:
    rel = os.path.relpath(KUSTOMIZE, folder)
    (folder / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [{rel}/{overlay}]\n"
        # The bus-auth component comes with the base. The device plugin too, which is a bus
        # client of its own when an overlay lists it.
        f"components: [{rel}/components/device-plugin, {rel}/components/device-plugin-bus-auth]\n"
    )
    return render(folder)


@pytest.fixture(scope="module", params=["base", "overlays/eks", "overlays/local"])
def docs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Docs:
    return with_bus_auth(tmp_path_factory.mktemp("bus-auth"), request.param)


def _container(workload: dict[str, Any]) -> dict[str, Any]:
    [container] = workload["spec"]["template"]["spec"]["containers"]
    found: dict[str, Any] = container
    return found


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", ())}


def _token_audience(workload: dict[str, Any], path: str) -> str:
    """The audience of the projected ServiceAccount token mounted at ``path``, or ''."""
    pod = workload["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m["name"] for m in _container(workload).get("volumeMounts", ())}
    folder, _, name = path.rpartition("/")
    volumes = {v["name"]: v for v in pod.get("volumes", ())}
    volume = volumes.get(mounts.get(folder, ""), {})
    for source in volume.get("projected", {}).get("sources", ()):
        token = source.get("serviceAccountToken")
        if token and token["path"] == name:
            return str(token["audience"])
    return ""


def test_every_bus_client_presents_its_own_accounts_bus_token(docs: Docs) -> None:
    callout = _env(_container(by_kind(docs, "Deployment")["neuron-dra-bus-auth"]))
    audience = callout["NEURON_DRA_TOKEN_AUDIENCES"]
    every: tuple[Role, ...] = (*NODE_AGENTS, *CLUSTER_SERVICES, "admin")
    roles = {service_account_of(r): r for r in every}
    seen: dict[str, str] = {}
    for kind in WORKLOAD_KINDS:
        for name, workload in by_kind(docs, kind).items():
            env = _env(_container(workload))
            if "NEURON_DRA_NATS_SERVERS" not in env or name == "neuron-dra-bus-auth":
                continue
            token = env.get("NEURON_DRA_NATS_TOKEN_FILE")
            assert token, f"{kind} {name}: no NEURON_DRA_NATS_TOKEN_FILE"
            assert _token_audience(workload, token) == audience, (name, token)
            account = workload["spec"]["template"]["spec"]["serviceAccountName"]
            assert account in roles, f"{kind} {name}: ServiceAccount {account} has no bus identity"
            seen[name] = roles[account]
    # Every service of the product holds its own identity; only the declare Job is admin.
    assert sorted(seen.values()) == sorted(every)
    assert [n for n, r in seen.items() if r == "admin"] == ["neuron-dra-bus-declare"]
    assert "neuron-dra-bus-admin" in by_kind(docs, "ServiceAccount")


def test_a_reader_identity_exists_for_people_and_runs_nothing(docs: Docs) -> None:
    reader = service_account_of("reader")
    assert reader == "neuron-dra-bus-reader"
    assert by_kind(docs, "ServiceAccount")[reader]["automountServiceAccountToken"] is False
    for kind in WORKLOAD_KINDS:
        for name, workload in by_kind(docs, kind).items():
            assert workload["spec"]["template"]["spec"].get("serviceAccountName") != reader, name


def test_the_callout_and_the_declare_job_run_locked_down(docs: Docs) -> None:
    assert {"neuron-dra-bus-auth", "neuron-dra-bus-declare"} <= locked_down(docs)


def test_the_callout_may_only_review_tokens(docs: Docs) -> None:
    [binding] = [
        b
        for b in by_kind(docs, "ClusterRoleBinding").values()
        if any(s["name"] == "neuron-dra-bus-auth" for s in b["subjects"])
    ]
    rules = by_kind(docs, "ClusterRole")[binding["roleRef"]["name"]]["rules"]
    assert rules == [
        {
            "apiGroups": ["authentication.k8s.io"],
            "resources": ["tokenreviews"],
            "verbs": ["create"],
        }
    ]
    assert not [
        b
        for b in by_kind(docs, "RoleBinding").values()
        if any(s["name"] in ("neuron-dra-bus-auth", "neuron-dra-bus-admin") for s in b["subjects"])
    ]


def test_server_and_callout_read_the_keys_from_the_secret(docs: Docs) -> None:
    nats = by_kind(docs, "StatefulSet")["nats"]
    container = _container(nats)
    assert container["args"] == ["--config", "/etc/nats/auth.conf"]
    refs = {
        e["name"]: e["valueFrom"]["secretKeyRef"]
        for e in container["env"]
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    assert refs == {
        "NEURON_DRA_BUS_AUTH_ISSUER": {"name": keys.SECRET_NAME, "key": keys.PUBLIC},
        "NEURON_DRA_BUS_AUTH_PASSWORD": {"name": keys.SECRET_NAME, "key": keys.PASSWORD},
    }
    [config] = [c for n, c in by_kind(docs, "ConfigMap").items() if n.startswith("nats-config")]
    assert "include ./nats.conf" in config["data"]["auth.conf"]
    assert "jetstream" in config["data"]["nats.conf"]

    callout = by_kind(docs, "Deployment")["neuron-dra-bus-auth"]
    env = _env(_container(callout))
    # The seed reaches the callout only, the password both; the server never sees the seed.
    assert _mounted_secret_file(callout, env["NEURON_DRA_ISSUER_SEED_FILE"]) == (
        keys.SECRET_NAME,
        keys.SEED,
    )
    assert _mounted_secret_file(callout, env["NEURON_DRA_NATS_PASSWORD_FILE"]) == (
        keys.SECRET_NAME,
        keys.PASSWORD,
    )
    assert env["NEURON_DRA_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}


def test_the_keys_command_makes_the_secret_the_component_reads() -> None:
    manifest = keys.secret_manifest(keys.new_keys(), namespace="neuron-dra-driver")
    assert manifest["metadata"] == {"name": keys.SECRET_NAME, "namespace": "neuron-dra-driver"}
    data = manifest["data"]
    assert isinstance(data, dict)
    assert set(data) == {keys.SEED, keys.PUBLIC, keys.PASSWORD}


def eks_with_bus_auth(folder: Path) -> Path:
    """The eks overlay copied as a user copies it; the bus-auth component comes with the base."""
    rel = os.path.relpath(KUSTOMIZE, folder)
    for source in (KUSTOMIZE / "overlays" / "eks").iterdir():
        (folder / source.name).write_text(source.read_text())
    text = (folder / "kustomization.yaml").read_text()
    assert "- ../../components/bus-auth" not in text, "the base lists it: the overlay must not"
    text = text.replace("../../", f"{rel}/")
    (folder / "kustomization.yaml").write_text(text)
    return folder


def test_on_eks_every_client_reaches_the_server_and_streams_get_three_copies(
    tmp_path: Path,
) -> None:
    docs = render(eks_with_bus_auth(tmp_path))
    for kind in WORKLOAD_KINDS:
        for name, workload in by_kind(docs, kind).items():
            # The NATS NetworkPolicy admits the driver's pods by this label.
            labels = workload["spec"]["template"]["metadata"]["labels"]
            assert labels.get("app.kubernetes.io/part-of") == "neuron-dra", name
    # The declare Job makes streams with as many copies as the services ask for: a service
    # may not add copies itself.
    for kind in WORKLOAD_KINDS:
        for name, workload in by_kind(docs, kind).items():
            env = _env(_container(workload))
            if "NEURON_DRA_NATS_TOKEN_FILE" in env:
                assert env["NEURON_DRA_STREAM_REPLICAS"] == "3", name
    assert "auth.conf" in next(
        c["data"] for n, c in by_kind(docs, "ConfigMap").items() if n.startswith("nats-config")
    )


def _mounted_secret_file(workload: dict[str, Any], path: str) -> tuple[str, str]:
    """The (Secret, key) the file at ``path`` of the workload's container comes from."""
    pod = workload["spec"]["template"]["spec"]
    for mount in _container(workload).get("volumeMounts", ()):
        folder = mount["mountPath"].rstrip("/") + "/"
        if not path.startswith(folder):
            continue
        name = path.removeprefix(folder)
        [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        sources = [{"secret": volume["secret"]}] if "secret" in volume else []
        sources += volume.get("projected", {}).get("sources", [])
        for source in sources:
            secret: dict[str, Any] = source.get("secret") or {}
            for item in secret.get("items", ()):
                if item["path"] == name:
                    return secret.get("secretName") or secret["name"], item["key"]
    return "", ""


def test_every_bus_client_checks_the_servers_certificate(docs: Docs) -> None:
    clients = 0
    for kind in WORKLOAD_KINDS:
        for name, workload in by_kind(docs, kind).items():
            env = _env(_container(workload))
            if "NEURON_DRA_NATS_SERVERS" not in env:
                continue
            clients += 1
            assert _mounted_secret_file(workload, env["NEURON_DRA_NATS_TLS_CA"]) == (
                "neuron-dra-nats-tls",
                "ca.crt",
            ), name
    assert clients >= 10


def test_the_server_speaks_tls_with_the_secrets_certificate(docs: Docs) -> None:
    nats = by_kind(docs, "StatefulSet")["nats"]
    config = by_kind(docs, "ConfigMap")
    [files] = [c["data"] for c in config.values() if "auth.conf" in c.get("data", {})]
    assert "include ./tls.conf" in files["auth.conf"]
    paths = dict(
        line.strip().replace('"', "").split(": ", 1)
        for line in files["tls.conf"].splitlines()
        if line.strip().startswith(("cert_file", "key_file"))
    )
    assert _mounted_secret_file(nats, paths["cert_file"]) == ("neuron-dra-nats-tls", "tls.crt")
    assert _mounted_secret_file(nats, paths["key_file"]) == ("neuron-dra-nats-tls", "tls.key")
