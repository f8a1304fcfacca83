"""The device-plugin component runs neuron-dra's device plugin exactly on the nodes labelled
for the device plugin, never beside the DRA agents, locked down, with least-privilege RBAC."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from tests.unit.deploy.test_kustomize import by_kind
from tests.unit.deploy.test_overlays import (
    NODE_AGENTS,
    Docs,
    _node_matches,
    env,
    pod,
    with_components,
)

NAME = "neuron-dra-device-plugin"
TRN2 = {"node.kubernetes.io/instance-type": "trn2.48xlarge"}


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> Docs:
    return with_components(tmp_path_factory.mktemp("device-plugin"), "device-plugin")


@pytest.mark.parametrize(
    ("labels", "device_plugin"),
    [
        (TRN2, False),
        ({**TRN2, "neuron.aws.com/device-management": "dra"}, False),
        ({**TRN2, "neuron.aws.com/device-management": "device-plugin"}, True),
    ],
)
def test_a_node_is_served_by_the_device_plugin_or_the_dra_agents_never_both(
    docs: Docs, labels: dict[str, str], device_plugin: bool
) -> None:
    spec = pod(docs, "DaemonSet", NAME)["spec"]
    assert _node_matches(spec["affinity"], labels) is device_plugin
    for agent in NODE_AGENTS:
        agent_spec = pod(docs, "DaemonSet", agent)["spec"]
        assert _node_matches(agent_spec["affinity"], labels) is not device_plugin, agent


def test_the_plugin_reaches_the_kubelets_device_manager_and_reads_the_host(docs: Docs) -> None:
    spec = pod(docs, "DaemonSet", NAME)["spec"]
    [container] = spec["containers"]
    assert container["command"] == ["neuron-dra-device-plugin"]
    variables = env(docs, "DaemonSet", NAME)
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}
    plugins = mounts[f"{variables['NEURON_DRA_KUBELET_ROOT']}/device-plugins"]
    assert host[plugins["name"]] == "/var/lib/kubelet/device-plugins"
    assert not plugins.get("readOnly")
    root = variables["NEURON_DRA_HOST_ROOT"]
    for path in ("sys", "dev", "opt/aws/neuron"):
        assert mounts[f"{root}/{path}"]["readOnly"] is True
        assert host[mounts[f"{root}/{path}"]["name"]] == f"/{path}"
    assert variables["NEURON_DRA_DEV_ROOT"] == "/dev"
    ctx = container["securityContext"]
    assert ctx["runAsUser"] == 0  # the kubelet's socket directory is root's
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not spec.get("hostNetwork")


def test_the_plugin_may_only_list_pods_and_mark_them_served(docs: Docs) -> None:
    role = by_kind(docs, "ClusterRole")[NAME]
    rules = {
        (group, resource): sorted(rule["verbs"])
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert rules == {("", "pods"): ["list", "patch"]}
    [subject] = by_kind(docs, "ClusterRoleBinding")[NAME]["subjects"]
    assert subject["name"] == pod(docs, "DaemonSet", NAME)["spec"]["serviceAccountName"]


def test_the_plugin_reaches_the_nats_the_base_deploys_and_its_policy_admits_it(docs: Docs) -> None:
    service = by_kind(docs, "Service")["nats"]
    client = {p["name"]: p["port"] for p in service["spec"]["ports"]}["client"]
    url = urlsplit(str(env(docs, "DaemonSet", NAME)["NEURON_DRA_NATS_SERVERS"]))
    assert (url.hostname, url.port) == (f"nats.{service['metadata']['namespace']}.svc", client)
    labels = pod(docs, "DaemonSet", NAME)["metadata"]["labels"]
    discovery = pod(docs, "DaemonSet", "neuron-dra-discovery")["metadata"]["labels"]
    assert labels["app.kubernetes.io/part-of"] == discovery["app.kubernetes.io/part-of"]
