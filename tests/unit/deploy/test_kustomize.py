"""The kustomize trees render, and each service gets only the access it needs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

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
    assert {"NEURON_DRA_NODE_NAME", "NEURON_DRA_HARDWARE_ROOT"} <= env
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
    assert role["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["get", "create", "update"],
        }
    ]


def test_local_overlay_is_namespace_and_device_class_only() -> None:
    docs = render(KUSTOMIZE / "overlays" / "local")
    assert sorted((d["kind"], d["metadata"]["name"]) for d in docs) == [
        ("DeviceClass", "neuron.aws.com"),
        ("Namespace", "neuron-dra-driver"),
    ]
