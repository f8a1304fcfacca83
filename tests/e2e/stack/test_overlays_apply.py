"""Every overlay and optional component passes the real apiserver's checks, as
``kubectl apply --dry-run=server -k`` shows a user before the first install."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.fixtures.stack import KubeStack
from tests.unit.deploy.test_bus_auth_component import eks_with_bus_auth, with_bus_auth
from tests.unit.deploy.test_kustomize import KUSTOMIZE

pytestmark = pytest.mark.stack

#: The Prometheus Operator whose ServiceMonitor and PrometheusRule CRDs the monitoring
#: component is written against (its Go module carries them).
PROMETHEUS_OPERATOR = "github.com/prometheus-operator/prometheus-operator@v0.85.0"


def prometheus_operator_crds() -> list[Path]:
    out = subprocess.run(
        ["go", "mod", "download", "-json", PROMETHEUS_OPERATOR],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
        cwd="/",
        env={**os.environ, "GOFLAGS": "-mod=mod"},
    )
    folder = Path(json.loads(out.stdout)["Dir"]) / "example" / "prometheus-operator-crd"
    return [
        folder / f"monitoring.coreos.com_{kind}.yaml"
        for kind in ("servicemonitors", "prometheusrules")
    ]


@pytest.fixture(scope="module")
def stack(kube_stack: KubeStack) -> KubeStack:
    for crd in prometheus_operator_crds():
        kube_stack.kubectl("apply", "--server-side", "-f", str(crd))
    kube_stack.kubectl(
        "wait",
        "--for=condition=Established",
        "crd/servicemonitors.monitoring.coreos.com",
        "crd/prometheusrules.monitoring.coreos.com",
        "--timeout=60s",
    )
    return kube_stack


def with_components(tmp_path: Path, *components: str) -> Path:
    rel = os.path.relpath(KUSTOMIZE, tmp_path)
    listed = ", ".join(f"{rel}/components/{c}" for c in components)
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [{rel}/overlays/eks]\ncomponents: [{listed}]\n"
    )
    return tmp_path


def dry_run(stack: KubeStack, tree: Path) -> set[str]:
    proc = stack.kubectl("apply", "--dry-run=server", "-k", str(tree), "-o", "name", timeout=180)
    return set(proc.stdout.split())


@pytest.mark.parametrize("overlay", ["eks", "local", "local-processes"])
def test_the_apiserver_accepts_every_overlay(stack: KubeStack, overlay: str) -> None:
    applied = dry_run(stack, KUSTOMIZE / "overlays" / overlay)
    assert "deviceclass.resource.k8s.io/neuron.aws.com" in applied
    if overlay != "local-processes":
        assert "statefulset.apps/nats" in applied
        assert "daemonset.apps/neuron-dra-kubelet-plugin" in applied
        assert "networkpolicy.networking.k8s.io/nats" in applied


def test_the_apiserver_accepts_the_optional_components(stack: KubeStack, tmp_path: Path) -> None:
    applied = dry_run(stack, with_components(tmp_path, "monitoring", "otel-collector"))
    assert "servicemonitor.monitoring.coreos.com/neuron-dra" in applied
    assert "prometheusrule.monitoring.coreos.com/neuron-dra" in applied
    assert "deployment.apps/otel-collector" in applied


def test_the_apiserver_accepts_the_authenticated_bus(stack: KubeStack, tmp_path: Path) -> None:
    (tmp_path / "eks").mkdir()
    (tmp_path / "local").mkdir()
    with_bus_auth(tmp_path / "local", "overlays/local")
    for tree in (eks_with_bus_auth(tmp_path / "eks"), tmp_path / "local"):
        applied = dry_run(stack, tree)
        assert {
            "deployment.apps/neuron-dra-bus-auth",
            "serviceaccount/neuron-dra-bus-auth",
            "clusterrole.rbac.authorization.k8s.io/neuron-dra-bus-auth",
            "clusterrolebinding.rbac.authorization.k8s.io/neuron-dra-bus-auth",
            "serviceaccount/neuron-dra-bus-admin",
            "job.batch/neuron-dra-bus-declare",
            "statefulset.apps/nats",
            "daemonset.apps/neuron-dra-discovery",
        } <= applied, tree


def test_a_refused_manifest_is_reported(stack: KubeStack, tmp_path: Path) -> None:
    # The dry run is a real check: a PodDisruptionBudget the API refuses fails it, naming it.
    overlay = with_components(tmp_path, "otel-collector")
    (overlay / "bad.yaml").write_text(
        "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata:\n  name: bad\n"
        "  namespace: neuron-dra-driver\nspec:\n  maxUnavailable: 1\n  minAvailable: 1\n"
    )
    text = (overlay / "kustomization.yaml").read_text()
    (overlay / "kustomization.yaml").write_text(
        text.replace("resources: [", "resources: [bad.yaml, ")
    )
    proc = stack.kubectl("apply", "--dry-run=server", "-k", str(overlay), check=False, timeout=180)
    assert proc.returncode != 0
    assert "bad" in proc.stderr
    assert "minAvailable" in proc.stderr
