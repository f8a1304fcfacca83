"""The overlays a user installs render to what they promise: NATS in the base, a NATS cluster
and replicated streams on EKS, simulated hardware and local images on the local stack, and the
optional components wired to every service."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.unit.deploy.test_kustomize import KUSTOMIZE, by_kind, render

Docs = list[dict[str, Any]]

SERVICES = (
    ("DaemonSet", "neuron-dra-discovery"),
    ("DaemonSet", "neuron-dra-kubelet-plugin"),
    ("Deployment", "neuron-dra-slice-publisher"),
    ("Deployment", "neuron-dra-topology-allocator"),
    ("Deployment", "neuron-dra-ultraserver-operator"),
)
NODE_AGENTS = ("neuron-dra-discovery", "neuron-dra-kubelet-plugin")


@pytest.fixture(scope="module")
def base() -> Docs:
    return render(KUSTOMIZE / "base")


@pytest.fixture(scope="module")
def eks() -> Docs:
    return render(KUSTOMIZE / "overlays" / "eks")


@pytest.fixture(scope="module")
def local() -> Docs:
    return render(KUSTOMIZE / "overlays" / "local")


def with_components(tmp_path: Path, *components: str) -> Docs:
    rel = os.path.relpath(KUSTOMIZE, tmp_path)
    listed = ", ".join(f"{rel}/components/{c}" for c in components)
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [{rel}/base]\ncomponents: [{listed}]\n"
    )
    return render(tmp_path)


def pod(docs: Docs, kind: str, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = by_kind(docs, kind)[name]["spec"]["template"]
    return spec


def env(docs: Docs, kind: str, name: str) -> dict[str, str | None]:
    [container] = pod(docs, kind, name)["spec"]["containers"]
    return {e["name"]: e.get("value") for e in container.get("env", ())}


def nats_conf(docs: Docs) -> str:
    [config] = [c for n, c in by_kind(docs, "ConfigMap").items() if n.startswith("nats-config")]
    text: str = config["data"]["nats.conf"]
    return text


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_every_service_reaches_the_nats_the_base_deploys(base: Docs) -> None:
    nats = by_kind(base, "StatefulSet")["nats"]
    service = by_kind(base, "Service")["nats"]
    assert selects(service["spec"]["selector"], nats["spec"]["template"]["metadata"]["labels"])
    client = {p["name"]: p["port"] for p in service["spec"]["ports"]}["client"]
    # JetStream keeps the streams on a volume of the pod.
    [claim] = nats["spec"]["volumeClaimTemplates"]
    mounts = {
        m["name"]: m["mountPath"]
        for m in nats["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    }
    assert f"store_dir: {mounts[claim['metadata']['name']]}" in nats_conf(base)
    for kind, name in SERVICES:
        url = urlsplit(str(env(base, kind, name)["NEURON_DRA_NATS_SERVERS"]))
        assert url.hostname == f"nats.{service['metadata']['namespace']}.svc", name
        assert url.port == client, name


def test_config_changes_roll_the_nats_servers(base: Docs) -> None:
    # A generated name: a changed nats.conf is a new ConfigMap, so the pods restart with it.
    volumes = pod(base, "StatefulSet", "nats")["spec"]["volumes"]
    [name] = [v["configMap"]["name"] for v in volumes if "configMap" in v]
    assert re.fullmatch(r"nats-config-[a-z0-9]{10}", name)
    assert name in by_kind(base, "ConfigMap")


def test_eks_runs_a_three_server_cluster_with_three_copies_of_each_stream(eks: Docs) -> None:
    nats = by_kind(eks, "StatefulSet")["nats"]
    replicas = nats["spec"]["replicas"]
    assert replicas == 3
    namespace = nats["metadata"]["namespace"]
    headless = by_kind(eks, "Service")[nats["spec"]["serviceName"]]
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    routes = re.findall(r"nats://([\w.-]+):6222", nats_conf(eks))
    assert routes == [
        f"nats-{i}.{nats['spec']['serviceName']}.{namespace}.svc" for i in range(replicas)
    ]
    for kind, name in SERVICES:
        assert env(eks, kind, name)["NEURON_DRA_STREAM_REPLICAS"] == str(replicas), name
    [budget] = by_kind(eks, "PodDisruptionBudget").values()
    assert budget["spec"]["maxUnavailable"] == 1
    assert selects(
        budget["spec"]["selector"]["matchLabels"], nats["spec"]["template"]["metadata"]["labels"]
    )


def test_eks_runs_two_slice_publishers_sharing_the_nodes(eks: Docs, base: Docs) -> None:
    publisher = by_kind(eks, "Deployment")["neuron-dra-slice-publisher"]
    assert publisher["spec"]["replicas"] == 2
    assert env(eks, "Deployment", "neuron-dra-slice-publisher")["NEURON_DRA_PARTITIONS"] == "2"
    assert "NEURON_DRA_PARTITIONS" not in env(base, "Deployment", "neuron-dra-slice-publisher")


def test_eks_pulls_every_image_from_a_registry(eks: Docs) -> None:
    for kind in ("Deployment", "DaemonSet", "StatefulSet"):
        for name, workload in by_kind(eks, kind).items():
            for container in workload["spec"]["template"]["spec"]["containers"]:
                registry = container["image"].split("/")[0]
                assert "." in registry, (name, container["image"])
                assert ":" in container["image"].split("/")[-1], (name, container["image"])


def _node_matches(affinity: dict[str, Any], labels: dict[str, str]) -> bool:
    terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    for term in terms["nodeSelectorTerms"]:
        ok = True
        for expr in term["matchExpressions"]:
            value = labels.get(expr["key"])
            if expr["operator"] == "In":
                ok &= value in expr["values"]
            elif expr["operator"] == "NotIn":
                ok &= value not in expr["values"]
            else:
                raise AssertionError(f"operator {expr['operator']} not modelled")
        if ok:
            return True
    return False


@pytest.mark.parametrize("overlay", ["base", "eks", "local"])
def test_node_agents_run_on_neuron_nodes_unless_aws_device_plugin_keeps_them(
    overlay: str, request: pytest.FixtureRequest
) -> None:
    docs: Docs = request.getfixturevalue(overlay)
    trn2 = {"node.kubernetes.io/instance-type": "trn2.48xlarge"}
    for name in NODE_AGENTS:
        spec = pod(docs, "DaemonSet", name)["spec"]
        assert _node_matches(spec["affinity"], trn2), name
        assert _node_matches(
            spec["affinity"], {**trn2, "neuron.aws.com/device-management": "dra"}
        ), name
        assert not _node_matches(
            spec["affinity"], {**trn2, "neuron.aws.com/device-management": "device-plugin"}
        ), name
        assert not _node_matches(spec["affinity"], {"node.kubernetes.io/instance-type": "m5.large"})
        tolerated = {(t["key"], t["effect"]) for t in spec["tolerations"]}
        assert ("aws.amazon.com/neuron", "NoSchedule") in tolerated, name


def test_local_reads_simulated_hardware_and_never_pulls(local: Docs) -> None:
    for name in NODE_AGENTS:
        spec = pod(local, "DaemonSet", name)["spec"]
        host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
        for volume in ("sys", "dev", "neuron"):
            assert host[volume].startswith("/var/lib/neuron-dra/simulated/"), (name, volume)
    assert env(local, "DaemonSet", "neuron-dra-kubelet-plugin")["NEURON_DRA_DEV_ROOT"] == (
        "/var/lib/neuron-dra/simulated/dev"
    )
    for kind in ("Deployment", "DaemonSet", "StatefulSet"):
        for name, workload in by_kind(local, kind).items():
            for container in workload["spec"]["template"]["spec"]["containers"]:
                assert container["image"].startswith("localhost/"), name
                assert container["imagePullPolicy"] == "Never", name


@pytest.mark.parametrize("overlay", ["eks", "local"])
def test_only_the_drivers_pods_and_other_servers_reach_nats(
    overlay: str, request: pytest.FixtureRequest
) -> None:
    docs: Docs = request.getfixturevalue(overlay)
    policy = by_kind(docs, "NetworkPolicy")["nats"]
    nats_labels = pod(docs, "StatefulSet", "nats")["metadata"]["labels"]
    assert selects(policy["spec"]["podSelector"]["matchLabels"], nats_labels)

    def admitted(labels: dict[str, str], port: int) -> bool:
        return any(
            port in {p["port"] for p in rule.get("ports", ())}
            and (
                "from" not in rule
                or any(selects(f["podSelector"]["matchLabels"], labels) for f in rule["from"])
            )
            for rule in policy["spec"]["ingress"]
        )

    for kind, name in SERVICES:
        assert admitted(pod(docs, kind, name)["metadata"]["labels"], 4222), name
    assert admitted(nats_labels, 6222)
    assert not admitted({"app": "someone-else"}, 4222)
    assert not admitted({"app.kubernetes.io/part-of": "neuron-dra"}, 6222)
    # The monitoring port is on the pod's loopback: no rule opens it to anyone.
    assert not any(admitted(labels, 8222) for labels in ({"app": "prometheus"}, nats_labels))


def test_otel_component_sends_every_services_traces_to_its_collector(tmp_path: Path) -> None:
    docs = with_components(tmp_path, "otel-collector")
    service = by_kind(docs, "Service")["otel-collector"]
    grpc = {p["name"]: p["port"] for p in service["spec"]["ports"]}["otlp-grpc"]
    collector = by_kind(docs, "Deployment")["otel-collector"]
    assert selects(service["spec"]["selector"], collector["spec"]["template"]["metadata"]["labels"])
    for kind, name in SERVICES:
        endpoint = urlsplit(str(env(docs, kind, name)["OTEL_EXPORTER_OTLP_ENDPOINT"]))
        assert endpoint.hostname == f"otel-collector.{service['metadata']['namespace']}.svc"
        assert endpoint.port == grpc
    config = next(
        c for n, c in by_kind(docs, "ConfigMap").items() if n.startswith("otel-collector-config")
    )
    assert f":{grpc}" in config["data"]["config.yaml"]
