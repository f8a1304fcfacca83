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


def test_default_scheduler_reaches_the_extender_on_the_node_port(docs: Docs) -> None:
    config = config_map(docs, "neuron-dra-default-scheduler-config", "kube-scheduler-config.yaml")
    assert "profiles" not in config  # every profile of the cluster's scheduler
    url = urlsplit(extender_of(config)["urlPrefix"])
    nodeport = by_kind(docs, "Service")["neuron-dra-scheduler-extender-nodeport"]
    assert (url.hostname, url.port) == ("127.0.0.1", nodeport["spec"]["ports"][0]["nodePort"])
    file = Path(__file__).resolve().parents[3] / "deploy/kustomize/components" / DEFAULT
    assert yaml.safe_load((file / "kube-scheduler-config.yaml").read_text()) == config


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
