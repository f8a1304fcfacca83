"""Containers run with the least the kernel allows them, and root only where host paths
demand it; the namespace carries Pod Security labels; the admission policies are installed
with the base and on the local stack."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.deploy.test_kustomize import KUSTOMIZE, by_kind, render

#: The containers that run as root: the kubelet plugin creates sockets in the kubelet's
#: root-owned plugin directories and writes /var/run/cdi; the health probe reads the kernel
#: log (/dev/kmsg, root's).
ROOT = {"neuron-dra-kubelet-plugin", "neuron-dra-health-probe"}
#: The only capability added anywhere: reading the kernel log needs CAP_SYSLOG.
ADDED = {"neuron-dra-health-probe": ["SYSLOG"]}


@pytest.fixture(scope="module")
def base() -> list[dict[str, Any]]:
    return render(KUSTOMIZE / "base")


def test_every_container_is_locked_down(base: list[dict[str, Any]]) -> None:
    seen = set()
    for kind in ("Deployment", "DaemonSet", "StatefulSet"):
        for name, workload in by_kind(base, kind).items():
            pod = workload["spec"]["template"]["spec"]
            pod_ctx = pod.get("securityContext", {})
            for container in pod["containers"]:
                ctx = {**pod_ctx, **container.get("securityContext", {})}
                assert ctx.get("privileged") is not True, name
                assert ctx["allowPrivilegeEscalation"] is False, name
                assert ctx["readOnlyRootFilesystem"] is True, name
                assert ctx["capabilities"]["drop"] == ["ALL"], name
                assert ctx["capabilities"].get("add", []) == ADDED.get(name, []), name
                assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}, name
                if name in ROOT:
                    assert ctx["runAsUser"] == 0, name
                else:
                    assert ctx["runAsNonRoot"] is True, name
                    assert ctx["runAsUser"] != 0, name
                seen.add(name)
    assert {"nats", "neuron-dra-discovery", "neuron-dra-kubelet-plugin"} <= seen


def test_the_namespace_has_pod_security_labels(base: list[dict[str, Any]]) -> None:
    labels = by_kind(base, "Namespace")["neuron-dra-driver"]["metadata"]["labels"]
    # Host paths (sysfs, /dev, the kubelet's directories) need the privileged level.
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    assert labels["pod-security.kubernetes.io/audit"] == "restricted"


@pytest.mark.parametrize("tree", ["base", "overlays/local-processes", "overlays/eks"])
def test_the_admission_policies_are_bound_wherever_the_driver_runs(tree: str) -> None:
    docs = render(KUSTOMIZE / tree)
    policies = by_kind(docs, "ValidatingAdmissionPolicy")
    bindings = by_kind(docs, "ValidatingAdmissionPolicyBinding")
    assert set(policies) == {"neuron-dra-resourceslices", "neuron-dra-operator-nodes"}
    assert {b["spec"]["policyName"] for b in bindings.values()} == set(policies)
    for binding in bindings.values():
        assert binding["spec"]["validationActions"] == ["Deny"]
    for policy in policies.values():
        assert policy["spec"]["failurePolicy"] == "Fail"
