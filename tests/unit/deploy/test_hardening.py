"""Containers run with the least the kernel allows them, and root only where host paths
demand it; the namespace carries Pod Security labels; the admission policies are installed
with the base and on the local stack."""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.unit.deploy.test_kustomize import KUSTOMIZE, by_kind, render

#: The containers that run as root: the kubelet plugin creates sockets in the kubelet's
#: root-owned plugin directories and writes /var/run/cdi; the health probe reads the kernel
#: log (/dev/kmsg, root's); the device plugin (a component) creates its socket in the
#: kubelet's root-owned device-plugins directory.
ROOT = {"neuron-dra-kubelet-plugin", "neuron-dra-health-probe", "neuron-dra-device-plugin"}
#: The only capability added anywhere: reading the kernel log needs CAP_SYSLOG.
ADDED = {"neuron-dra-health-probe": ["SYSLOG"]}


@pytest.fixture(scope="module")
def base() -> list[dict[str, Any]]:
    return render(KUSTOMIZE / "base")


def test_every_container_is_locked_down(base: list[dict[str, Any]]) -> None:
    seen = locked_down(base)
    assert {"nats", "neuron-dra-discovery", "neuron-dra-kubelet-plugin"} <= seen


def locked_down(docs: list[dict[str, Any]]) -> set[str]:
    """Check every workload's containers; return the workloads' names."""
    seen = set()
    for kind in ("Deployment", "DaemonSet", "StatefulSet", "Job"):
        for name, workload in by_kind(docs, kind).items():
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
    return seen


#: The only pods on the host's network: discovery asks the kubelet's health endpoint, which
#: listens on the node's loopback.
HOST_NETWORK = {"neuron-dra-discovery"}


def test_only_discovery_shares_the_host_network_and_it_watches_the_kubelet(
    base: list[dict[str, Any]],
) -> None:
    host_ports: dict[int, str] = {}
    on_host = set()
    for kind in ("Deployment", "DaemonSet", "StatefulSet"):
        for name, workload in by_kind(base, kind).items():
            pod = workload["spec"]["template"]["spec"]
            if not pod.get("hostNetwork"):
                continue
            on_host.add(name)
            # Cluster DNS still resolves the NATS service name.
            assert pod["dnsPolicy"] == "ClusterFirstWithHostNet", name
            for container in pod["containers"]:
                for port in container.get("ports", []):
                    assert port["containerPort"] not in host_ports, (name, host_ports)
                    host_ports[port["containerPort"]] = name
    assert on_host == HOST_NETWORK
    [container] = by_kind(base, "DaemonSet")["neuron-dra-discovery"]["spec"]["template"]["spec"][
        "containers"
    ]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NEURON_DRA_KUBELET_HEALTHZ_URL"] == "http://127.0.0.1:10248/healthz"
    # The kubelet's own ports (10248 healthz, 10250 API, 10255 read-only) stay free.
    assert not {10248, 10250, 10255} & set(host_ports)


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
    assert set(policies) == {
        "neuron-dra-resourceslices",
        "neuron-dra-operator-nodes",
        "neuron-dra-workload-claims",
        "neuron-dra-slice-publisher-drivers",
        "neuron-dra-health-probe-nodes",
        "neuron-dra-kubelet-plugin-nodes",
        "neuron-dra-failure-detector-nodes",
        "neuron-dra-device-plugin-pods",
    }
    assert {b["spec"]["policyName"] for b in bindings.values()} == set(policies)
    for binding in bindings.values():
        assert binding["spec"]["validationActions"] == ["Deny"]
    for policy in policies.values():
        assert policy["spec"]["failurePolicy"] == "Fail"


@pytest.fixture(scope="module")
def with_components(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The base (with bus-auth) and every other component whose workloads serve HTTP, as a
    user's overlay."""
    overlay = tmp_path_factory.mktemp("overlay")
    rel = os.path.relpath(KUSTOMIZE, overlay)
    components = ", ".join(f"{rel}/components/{c}" for c in ("device-plugin", "scheduler-extender"))
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [{rel}/base]\ncomponents: [{components}]\n"
    )
    return render(overlay)


def test_probes_and_metrics_listen_on_the_pods_address_only(
    with_components: list[dict[str, Any]],
) -> None:
    # The services listen on loopback unless told; each of ours is told its pod's address,
    # where the kubelet probes it and Prometheus scrapes it. On the host's network
    # (discovery) that is the node's address: not every interface of the host.
    served = set()
    for kind in ("Deployment", "DaemonSet"):
        for name, workload in by_kind(with_components, kind).items():
            for container in workload["spec"]["template"]["spec"]["containers"]:
                env = {e["name"]: e for e in container.get("env", [])}
                if "NEURON_DRA_HTTP_PORT" not in env and not any(
                    p.get("name") == "http" for p in container.get("ports", [])
                ):
                    continue
                assert env["NEURON_DRA_HTTP_HOST"]["valueFrom"] == {
                    "fieldRef": {"fieldPath": "status.podIP"}
                }, name
                served.add(name)
    assert {
        "neuron-dra-discovery",
        "neuron-dra-kubelet-plugin",
        "neuron-dra-slice-publisher",
        "neuron-dra-device-plugin",
        "neuron-dra-bus-auth",
    } <= served
    assert any("extender" in name for name in served), served
