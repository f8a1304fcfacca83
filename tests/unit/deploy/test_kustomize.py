"""The kustomize trees render, and each service gets only the access it needs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from neuron_dra_common.bus.declarations import PUBLISHER_SHARES
from neuron_dra_slice_publisher.partitions import lease_names

REPO = Path(__file__).resolve().parents[3]
KUSTOMIZE = REPO / "deploy" / "kustomize"


def render(path: Path) -> list[dict[str, Any]]:
    kubectl = Path(sys.executable).parent / "kubectl"
    out = subprocess.run(
        [str(kubectl), "kustomize", str(path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


@pytest.fixture(scope="module")
def base() -> list[dict[str, Any]]:
    return render(KUSTOMIZE / "base")


def test_base_has_the_device_class_namespace_and_both_workloads(base: list[dict[str, Any]]) -> None:
    assert "neuron.aws.com" in by_kind(base, "DeviceClass")
    assert "neuron-dra-driver" in by_kind(base, "Namespace")
    ds = by_kind(base, "DaemonSet")["neuron-dra-discovery"]
    deploy = by_kind(base, "Deployment")["neuron-dra-slice-publisher"]
    for workload in (ds, deploy):
        assert workload["metadata"]["namespace"] == "neuron-dra-driver"
        [container] = workload["spec"]["template"]["spec"]["containers"]
        assert container["image"] == "neuron-dra:0.1.0"
    env = {e["name"] for e in ds["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert {"NEURON_DRA_NODE_NAME", "NEURON_DRA_HOST_ROOT"} <= env
    assert deploy["spec"]["replicas"] >= 2


def test_discovery_has_no_api_access(base: list[dict[str, Any]]) -> None:
    sa = by_kind(base, "ServiceAccount")["neuron-dra-discovery"]
    assert sa["automountServiceAccountToken"] is False
    bound = [
        b
        for kind in ("RoleBinding", "ClusterRoleBinding")
        for b in by_kind(base, kind).values()
        if any(s["name"] == "neuron-dra-discovery" for s in b["subjects"])
    ]
    assert bound == []


def test_slice_publisher_rules_are_least_privilege(base: list[dict[str, Any]]) -> None:
    rules = by_kind(base, "ClusterRole")["neuron-dra-slice-publisher"]["rules"]
    granted = {
        (g, r): set(rule["verbs"])
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }
    assert granted == {
        ("resource.k8s.io", "resourceslices"): {
            "get",
            "list",
            "watch",
            "create",
            "update",
            "delete",
        },
        ("", "nodes"): {"get", "list", "watch"},
    }
    role = by_kind(base, "Role")["neuron-dra-slice-publisher"]
    assert role["metadata"]["namespace"] == "neuron-dra-driver"
    # Its Lease, those of each share, and (read) those of the other numbers of shares.
    names = tuple(
        name
        for n in range(1, PUBLISHER_SHARES + 1)
        for name in lease_names("neuron-dra-slice-publisher", n)
    )
    assert _granted(role["rules"]) == {
        ("coordination.k8s.io", "leases", names): {"get", "update"},
        ("coordination.k8s.io", "leases", ()): {"create"},
    }


def test_process_stack_overlay_is_cluster_objects_only() -> None:
    # The default local stack runs every service as a process: no workloads (their accounts
    # and RBAC come from the base, see neuron_dra_cli.stack.accounts).
    docs = render(KUSTOMIZE / "overlays" / "local-processes")
    assert sorted((d["kind"], d["metadata"]["name"]) for d in docs) == [
        ("CustomResourceDefinition", "neuronultraservers.neuron.aws.com"),
        ("CustomResourceDefinition", "neuronultraserverworkloads.neuron.aws.com"),
        ("DeviceClass", "neuron.aws.com"),
        ("Namespace", "neuron-dra-driver"),
        ("ValidatingAdmissionPolicy", "neuron-dra-device-plugin-pods"),
        ("ValidatingAdmissionPolicy", "neuron-dra-failure-detector-nodes"),
        ("ValidatingAdmissionPolicy", "neuron-dra-health-probe-nodes"),
        ("ValidatingAdmissionPolicy", "neuron-dra-kubelet-plugin-nodes"),
        ("ValidatingAdmissionPolicy", "neuron-dra-operator-nodes"),
        ("ValidatingAdmissionPolicy", "neuron-dra-resourceslices"),
        ("ValidatingAdmissionPolicy", "neuron-dra-slice-publisher-drivers"),
        ("ValidatingAdmissionPolicy", "neuron-dra-workload-claims"),
        ("ValidatingAdmissionPolicyBinding", "neuron-dra-device-plugin-pods"),
        ("ValidatingAdmissionPolicyBinding", "neuron-dra-failure-detector-nodes"),
        ("ValidatingAdmissionPolicyBinding", "neuron-dra-health-probe-nodes"),
        ("ValidatingAdmissionPolicyBinding", "neuron-dra-kubelet-plugin-nodes"),
        ("ValidatingAdmissionPolicyBinding", "neuron-dra-operator-nodes"),
        ("ValidatingAdmissionPolicyBinding", "neuron-dra-resourceslices"),
        ("ValidatingAdmissionPolicyBinding", "neuron-dra-slice-publisher-drivers"),
        ("ValidatingAdmissionPolicyBinding", "neuron-dra-workload-claims"),
    ]


def _granted(rules: list[dict[str, Any]]) -> dict[tuple[str, str, tuple[str, ...]], set[str]]:
    return {
        (g, r, tuple(rule.get("resourceNames") or ())): set(rule["verbs"])
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }


def _bindings(docs: list[dict[str, Any]], account: str) -> list[dict[str, Any]]:
    return [
        b
        for kind in ("RoleBinding", "ClusterRoleBinding")
        for b in by_kind(docs, kind).values()
        if any(s["name"] == account for s in b["subjects"])
    ]


def test_allocator_runs_alone_and_the_operator_with_a_standby(base: list[dict[str, Any]]) -> None:
    allocator = by_kind(base, "Deployment")["neuron-dra-topology-allocator"]
    assert allocator["spec"]["replicas"] == 1
    assert allocator["spec"]["strategy"] == {"type": "Recreate"}
    # The operator elects a leader, so a second replica stands by and rollouts may overlap.
    operator = by_kind(base, "Deployment")["neuron-dra-ultraserver-operator"]
    assert operator["spec"]["replicas"] == 2
    assert "strategy" not in operator["spec"]
    [op_container] = operator["spec"]["template"]["spec"]["containers"]
    fields = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}) for e in op_container["env"]}
    assert fields["NEURON_DRA_IDENTITY"] == {"fieldPath": "metadata.name"}
    assert fields["NEURON_DRA_NAMESPACE"] == {"fieldPath": "metadata.namespace"}
    for name in ("neuron-dra-topology-allocator", "neuron-dra-ultraserver-operator"):
        deploy = by_kind(base, "Deployment")[name]
        assert deploy["metadata"]["namespace"] == "neuron-dra-driver"
        pod = deploy["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == name
        [container] = pod["containers"]
        assert container["image"] == "neuron-dra:0.1.0"
        assert container["command"] == [name]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["NEURON_DRA_NATS_SERVERS"].startswith("nats://")
        assert by_kind(base, "ServiceAccount")[name]["metadata"]["namespace"] == "neuron-dra-driver"


def test_allocator_has_no_api_access(base: list[dict[str, Any]]) -> None:
    name = "neuron-dra-topology-allocator"
    assert by_kind(base, "ServiceAccount")[name]["automountServiceAccountToken"] is False
    pod = by_kind(base, "Deployment")[name]["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert _bindings(base, name) == []


def test_operator_rules_are_what_it_calls(base: list[dict[str, Any]]) -> None:
    # Each grant below is a call in services/ultraserver-operator: informers list and watch,
    # server-side apply is a patch (and a create where the object may not exist yet); a
    # Node is read before its record is compare-and-set.
    name = "neuron-dra-ultraserver-operator"
    cluster = by_kind(base, "ClusterRole")[name]["rules"]
    assert _granted(cluster) == {
        ("neuron.aws.com", "neuronultraserverworkloads", ()): {"list", "watch", "patch"},
        ("neuron.aws.com", "neuronultraserverworkloads/status", ()): {"patch"},
        ("", "nodes", ()): {"get", "list", "watch", "patch"},
        ("resource.k8s.io", "resourceslices", ()): {"list", "watch"},
        ("resource.k8s.io", "resourceclaimtemplates", ()): {"get", "create", "patch", "delete"},
        ("resource.k8s.io", "resourceclaims", ()): {"list", "watch"},
        ("resource.k8s.io", "deviceclasses", ("efa.networking.k8s.aws",)): {"get"},
        # pending.py: DeviceClasses, unscheduled pods and claims are watched, and the
        # Events said before are listed.
        ("resource.k8s.io", "deviceclasses", ()): {"list", "watch"},
        ("", "pods", ()): {"list", "watch", "delete"},
        ("", "events", ()): {"list", "create"},
        ("", "namespaces", ("neuron-dra-driver",)): {"patch"},
    }
    role = by_kind(base, "Role")[name]
    assert role["metadata"]["namespace"] == "neuron-dra-driver"
    assert _granted(role["rules"]) == {
        ("neuron.aws.com", "neuronultraservers", ()): {
            "list",
            "watch",
            "create",
            "patch",
            "delete",
        },
        ("neuron.aws.com", "neuronultraservers/status", ()): {"patch"},
        ("coordination.k8s.io", "leases", ("neuron-dra-ultraserver-operator",)): {
            "get",
            "update",
        },
        ("coordination.k8s.io", "leases", ()): {"create"},
    }
    bound = {(b["kind"], b["roleRef"]["name"]) for b in _bindings(base, name)}
    assert bound == {("ClusterRoleBinding", name), ("RoleBinding", name)}
    # Nothing writes Nodes, workloads or pods wholesale (only its own Lease is updated), and
    # nothing reads Secrets.
    for rule in cluster + role["rules"]:
        if rule["resources"] != ["leases"]:
            assert not {"update", "*"} & set(rule["verbs"]), rule
        assert "secrets" not in rule["resources"], rule


def test_operator_uses_only_the_resources_granted() -> None:
    # The operator's API resources are declared in model.py and the shared kube package;
    # a new one there must come with a rule here.
    src = REPO / "services" / "ultraserver-operator" / "src" / "neuron_dra_ultraserver_operator"
    used = set()
    for path in src.glob("*.py"):
        text = path.read_text()
        for const in (
            "NUSW",
            "NUS",
            "NODES",
            "RESOURCE_SLICES",
            "RESOURCE_CLAIM_TEMPLATES",
            "RESOURCE_CLAIMS",
            "PODS",
            "EVENTS",
            "NAMESPACES",
            "DEVICE_CLASSES",
        ):
            if f"{const}," in text or f"{const})" in text or f"{const}.path" in text:
                used.add(const)
        # Events are written through the client's post_event verb.
        if ".post_event(" in text:
            used.add("EVENTS")
    assert used == {
        "NUSW",
        "NUS",
        "NODES",
        "RESOURCE_SLICES",
        "RESOURCE_CLAIM_TEMPLATES",
        "RESOURCE_CLAIMS",
        "PODS",
        "EVENTS",
        "NAMESPACES",
        "DEVICE_CLASSES",
    }


def test_plugin_files_live_on_host_paths_that_last_exactly_one_boot(
    base: list[dict[str, Any]],
) -> None:
    pod = by_kind(base, "DaemonSet")["neuron-dra-kubelet-plugin"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    mounts: dict[str, str] = {
        m["mountPath"]: host[m["name"]] for m in container["volumeMounts"] if m["name"] in host
    }

    def host_path(path: str) -> str:
        mount = max((m for m in mounts if path.startswith(m.rstrip("/") + "/")), key=len)
        return mounts[mount] + path[len(mount) :]

    # CDI specs and the checkpoint are both void after a reboot: both on the node's tmpfs
    # (/run, which /var/run points at), where the runtime and the next plugin find them.
    checkpoint = host_path(env["NEURON_DRA_CHECKPOINT_PATH"])
    assert checkpoint.startswith("/run/")
    assert mounts[env["NEURON_DRA_CDI_ROOT"]] in ("/run/cdi", "/var/run/cdi")


# -- the monitoring component ------------------------------------------------------------------

WORKLOADS = (
    ("DaemonSet", "neuron-dra-discovery"),
    ("DaemonSet", "neuron-dra-kubelet-plugin"),
    ("Deployment", "neuron-dra-slice-publisher"),
    ("Deployment", "neuron-dra-topology-allocator"),
    ("Deployment", "neuron-dra-ultraserver-operator"),
)


@pytest.fixture(scope="module")
def monitored(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    # An overlay as a user writes one: the base plus the component.
    overlay = tmp_path_factory.mktemp("overlay")
    rel = os.path.relpath(KUSTOMIZE, overlay)
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [{rel}/base]\ncomponents: [{rel}/components/monitoring]\n"
    )
    return render(overlay)


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_service_monitor_scrapes_every_workload_on_its_http_port(
    monitored: list[dict[str, Any]],
) -> None:
    [monitor] = by_kind(monitored, "ServiceMonitor").values()
    assert monitor["metadata"]["namespace"] == "neuron-dra-driver"
    selected = [
        s
        for s in by_kind(monitored, "Service").values()
        if _matches(monitor["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])
    ]
    [endpoint] = monitor["spec"]["endpoints"]
    scraped = set()
    for service in selected:
        [port] = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
        pods = [
            (kind, name)
            for kind, name in WORKLOADS
            if _matches(
                service["spec"]["selector"],
                by_kind(monitored, kind)[name]["spec"]["template"]["metadata"]["labels"],
            )
        ]
        assert len(pods) == 1, (service["metadata"]["name"], pods)
        kind, name = pods[0]
        [container] = by_kind(monitored, kind)[name]["spec"]["template"]["spec"]["containers"]
        named = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert port["targetPort"] in named, (name, port)
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["NEURON_DRA_HTTP_PORT"] == str(named[port["targetPort"]])
        # The job label the rules and dashboard use is the workload's name.
        assert service["metadata"]["labels"][monitor["spec"]["jobLabel"]] == name
        scraped.add(name)
    assert scraped == {name for _, name in WORKLOADS}


def test_rules_and_dashboard_come_with_the_component(monitored: list[dict[str, Any]]) -> None:
    rules = by_kind(monitored, "PrometheusRule")["neuron-dra"]
    alerts = {r["alert"] for g in rules["spec"]["groups"] for r in g["rules"]}
    assert {
        "NeuronDraDeadLetters",
        "NeuronDraSlicePublisherNoLeader",
        "NeuronDraOperatorNoLeader",
        "NeuronDraPrepareFailures",
        "NeuronDraWorkloadsNotReady",
    } <= alerts
    dashboard = by_kind(monitored, "ConfigMap")["neuron-dra-dashboard"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["metadata"]["namespace"] == "neuron-dra-driver"
    [text] = dashboard["data"].values()
    board = json.loads(text)
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", ())]
    exprs += [r["expr"] for g in rules["spec"]["groups"] for r in g["rules"]]
    named = {m for e in exprs for m in re.findall(r"\b(neuron_\w+)", e)}
    assert named, "no metric named"
    # One prefix; neuron_* alone is what AWS's neuron-monitor exports.
    assert all(m.startswith("neuron_dra_") for m in named), sorted(named)
    # Rendering alone leaves everything else as it was: the component only adds.
    assert {(d["kind"], d["metadata"]["name"]) for d in render(KUSTOMIZE / "base")} <= {
        (d["kind"], d["metadata"]["name"]) for d in monitored
    }


def test_every_service_knows_its_pod_for_its_spans(base: list[dict[str, Any]]) -> None:
    for kind, name in WORKLOADS:
        [container] = by_kind(base, kind)[name]["spec"]["template"]["spec"]["containers"]
        fields = {
            e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
            for e in container["env"]
            if "valueFrom" in e
        }
        assert fields["K8S_POD_NAME"] == "metadata.name", name
        assert fields["K8S_POD_NAMESPACE"] == "metadata.namespace", name
        node = fields.get("K8S_NODE_NAME") or fields.get("NEURON_DRA_NODE_NAME")
        assert node == "spec.nodeName", name


def test_audit_and_alerts_run_alone_without_api_access(base: list[dict[str, Any]]) -> None:
    for name, command in (
        ("neuron-dra-audit", "neuron-dra-audit"),
        ("neuron-dra-alerts", "neuron-dra-alerts"),
    ):
        deploy = by_kind(base, "Deployment")[name]
        assert deploy["metadata"]["namespace"] == "neuron-dra-driver"
        assert deploy["spec"]["replicas"] == 1
        assert deploy["spec"]["strategy"] == {"type": "Recreate"}
        pod = deploy["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == name
        assert pod["automountServiceAccountToken"] is False
        assert by_kind(base, "ServiceAccount")[name]["automountServiceAccountToken"] is False
        assert _bindings(base, name) == []
        [container] = pod["containers"]
        assert container["command"] == [command]
    audit = by_kind(base, "Deployment")["neuron-dra-audit"]["spec"]["template"]["spec"]
    # Its log's volume, beside its bus token.
    [mount] = [m for m in audit["containers"][0]["volumeMounts"] if m["name"] != "bus-token"]
    env = {e["name"]: e.get("value") for e in audit["containers"][0]["env"]}
    assert env["NEURON_DRA_AUDIT_FILE"].startswith(mount["mountPath"] + "/")
    alerts = by_kind(base, "Deployment")["neuron-dra-alerts"]["spec"]["template"]["spec"]
    [url] = [
        e for e in alerts["containers"][0]["env"] if e["name"] == "NEURON_DRA_ALERTMANAGER_URL"
    ]
    ref = url["valueFrom"]["configMapKeyRef"]
    config = by_kind(base, "ConfigMap")[ref["name"]]
    assert config["data"][ref["key"]].startswith("http")


def test_health_probe_may_only_read_nodes_and_patch_their_status(
    base: list[dict[str, Any]],
) -> None:
    ds = by_kind(base, "DaemonSet")["neuron-dra-health-probe"]
    spec = ds["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "neuron-dra-health-probe"
    [container] = spec["containers"]
    assert container["command"] == ["neuron-dra-health-probe"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NEURON_DRA_KERNEL_LOG"] == "/host/dev/kmsg"
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYSLOG"]}
    rules = by_kind(base, "ClusterRole")["neuron-dra-health-probe"]["rules"]
    assert _granted(rules) == {("", "nodes", ()): {"get"}, ("", "nodes/status", ()): {"patch"}}
    [binding] = _bindings(base, "neuron-dra-health-probe")
    assert binding["roleRef"]["name"] == "neuron-dra-health-probe"
