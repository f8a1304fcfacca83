"""The scheduler-extender component renders both of AWS's ways: a second scheduler
(`my-scheduler`) and the default scheduler, each reaching the extender, which runs locked down
with least-privilege RBAC."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tests.unit.deploy.test_kustomize import by_kind
from tests.unit.deploy.test_overlays import Docs, selects, with_components

COMPONENT = "scheduler-extender"
DEFAULT = "scheduler-extender/default-scheduler"
VERBS = {"filterVerb": "filter", "prioritizeVerb": "prioritize", "bindVerb": "bind"}
MANAGED = {"aws.amazon.com/neuron", "aws.amazon.com/neurondevice", "aws.amazon.com/neuroncore"}


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> Docs:
    return with_components(tmp_path_factory.mktemp("extender"), COMPONENT, DEFAULT)


def config_map(docs: Docs, prefix: str, key: str) -> dict[str, Any]:
    [cm] = [c for n, c in by_kind(docs, "ConfigMap").items() if n.startswith(prefix)]
    loaded: dict[str, Any] = yaml.safe_load(cm["data"][key])
    return loaded


def extender_of(config: dict[str, Any]) -> dict[str, Any]:
    ext: dict[str, Any]
    [ext] = config["extenders"]
    assert {k: ext.get(k) for k in VERBS} == VERBS
    assert {r["name"] for r in ext["managedResources"]} == MANAGED
    assert ext["ignorable"] is False
    return ext


def test_my_scheduler_profile_calls_the_extender_service(docs: Docs) -> None:
    config = config_map(docs, "my-scheduler-config", "my-scheduler-config.yaml")
    assert [p["schedulerName"] for p in config["profiles"]] == ["my-scheduler"]
    url = urlsplit(extender_of(config)["urlPrefix"])
    service = by_kind(docs, "Service")["neuron-dra-scheduler-extender"]
    assert url.hostname == f"neuron-dra-scheduler-extender.{service['metadata']['namespace']}.svc"
    assert url.port == service["spec"]["ports"][0]["port"] == 12345
    extender = by_kind(docs, "Deployment")["neuron-dra-scheduler-extender"]
    assert selects(service["spec"]["selector"], extender["spec"]["template"]["metadata"]["labels"])
    scheduler = by_kind(docs, "Deployment")["my-scheduler"]["spec"]["template"]["spec"]
    [container] = scheduler["containers"]
    mounted = {v["name"]: v["mountPath"] for v in container["volumeMounts"]}["config"]
    assert f"--config={mounted}/my-scheduler-config.yaml" in container["command"]
    volume = {v["name"]: v for v in scheduler["volumes"]}["config"]
    assert volume["configMap"]["name"].startswith("my-scheduler-config")


def test_awss_service_name_leads_to_the_extender(docs: Docs) -> None:
    alias = by_kind(docs, "Service")["k8s-neuron-scheduler"]
    assert alias["metadata"]["namespace"] == "kube-system"
    assert alias["spec"]["externalName"] == (
        "neuron-dra-scheduler-extender.neuron-dra-driver.svc.cluster.local"
    )


def test_default_scheduler_reaches_the_extender_at_a_cluster_ip_with_no_node_port(
    docs: Docs,
) -> None:
    config = config_map(docs, "neuron-dra-default-scheduler-config", "kube-scheduler-config.yaml")
    assert "profiles" not in config  # every profile of the cluster's scheduler
    ext = extender_of(config)
    url = urlsplit(ext["urlPrefix"])
    service = by_kind(docs, "Service")["neuron-dra-scheduler-extender-control-plane"]
    assert (url.scheme, url.hostname) == ("https", service["spec"]["clusterIP"])
    assert url.port == service["spec"]["ports"][0]["port"]
    # The certificate is checked for the Service's DNS name, not the bare address.
    assert ext["tlsConfig"]["serverName"] == "neuron-dra-scheduler-extender.neuron-dra-driver.svc"
    assert not [s for s in by_kind(docs, "Service").values() if s["spec"].get("type") == "NodePort"]
    file = Path(__file__).resolve().parents[3] / "deploy/kustomize/components" / DEFAULT
    assert yaml.safe_load((file / "kube-scheduler-config.yaml").read_text()) == config


def test_both_schedulers_call_the_extender_over_mutual_tls(docs: Docs) -> None:
    my = extender_of(config_map(docs, "my-scheduler-config", "my-scheduler-config.yaml"))
    default = extender_of(
        config_map(docs, "neuron-dra-default-scheduler-config", "kube-scheduler-config.yaml")
    )
    for ext in (my, default):
        assert ext["urlPrefix"].startswith("https://")
        assert ext["enableHTTPS"] is True
        # Without caFile kube-scheduler would skip checking the extender's certificate.
        assert {"certFile", "keyFile", "caFile"} <= set(ext["tlsConfig"])
        assert not ext["tlsConfig"].get("insecure")
    # my-scheduler's files come from its Secret, mounted where its configuration says.
    pod = by_kind(docs, "Deployment")["my-scheduler"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    secret = {v["name"]: v for v in pod["volumes"]}["extender-client"]["secret"]
    assert secret["secretName"] == "my-scheduler-extender-client"
    for key, name in (("certFile", "tls.crt"), ("keyFile", "tls.key"), ("caFile", "ca.crt")):
        assert my["tlsConfig"][key] == f"{mounts['extender-client']}/{name}"
    # The extender's files come from its own Secret.
    pod = by_kind(docs, "Deployment")["neuron-dra-scheduler-extender"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    [mount] = container["volumeMounts"]
    [volume] = pod["volumes"]
    assert volume["secret"]["secretName"] == "neuron-dra-scheduler-extender-tls"
    assert (
        env["NEURON_DRA_TLS_CERT"],
        env["NEURON_DRA_TLS_KEY"],
        env["NEURON_DRA_TLS_CLIENT_CA"],
    ) == (
        f"{mount['mountPath']}/tls.crt",
        f"{mount['mountPath']}/tls.key",
        f"{mount['mountPath']}/ca.crt",
    )
    assert "NEURON_DRA_VERBS_INSECURE_HTTP" not in env


def test_only_the_schedulers_may_reach_the_verbs_port(docs: Docs) -> None:
    policy = by_kind(docs, "NetworkPolicy")["neuron-dra-scheduler-extender"]
    extender = by_kind(docs, "Deployment")["neuron-dra-scheduler-extender"]
    assert selects(
        policy["spec"]["podSelector"]["matchLabels"],
        extender["spec"]["template"]["metadata"]["labels"],
    )
    verbs = [
        r for r in policy["spec"]["ingress"] if {"port": "verbs", "protocol": "TCP"} in r["ports"]
    ]
    sources = [peer for rule in verbs for peer in rule["from"]]
    my_scheduler = by_kind(docs, "Deployment")["my-scheduler"]["spec"]["template"]["metadata"]
    assert sources[0]["podSelector"]["matchLabels"] == my_scheduler["labels"]
    # The control plane's scheduler (host network) by address, from the default-scheduler part.
    assert len(sources) == 2
    assert "ipBlock" in sources[1]
    # The probes and metrics port is open, and takes no verb (the server serves none there).
    [probes] = [r for r in policy["spec"]["ingress"] if "from" not in r]
    assert probes["ports"] == [{"port": "http", "protocol": "TCP"}]


def test_the_new_workloads_are_locked_down(docs: Docs) -> None:
    for name in ("neuron-dra-scheduler-extender", "my-scheduler"):
        pod = by_kind(docs, "Deployment")[name]["spec"]["template"]["spec"]
        for container in pod["containers"]:
            ctx = container["securityContext"]
            assert ctx["allowPrivilegeEscalation"] is False, name
            assert ctx["readOnlyRootFilesystem"] is True, name
            assert ctx["capabilities"] == {"drop": ["ALL"]}, name
            assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}, name
            assert ctx["runAsNonRoot"] is True, name
            assert ctx["runAsUser"] != 0, name
        assert not pod.get("hostNetwork"), name


def test_extender_rbac_is_least_privilege(docs: Docs) -> None:
    role = by_kind(docs, "ClusterRole")["neuron-dra-scheduler-extender"]
    rules = {
        (group, resource): sorted(rule["verbs"])
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert rules == {
        ("", "nodes"): ["get", "list", "watch"],
        ("", "pods"): ["get", "list", "watch"],
        ("", "pods/binding"): ["create"],
    }
    binding = by_kind(docs, "ClusterRoleBinding")["neuron-dra-scheduler-extender"]
    [subject] = binding["subjects"]
    deployment = by_kind(docs, "Deployment")["neuron-dra-scheduler-extender"]
    assert subject["name"] == deployment["spec"]["template"]["spec"]["serviceAccountName"]
