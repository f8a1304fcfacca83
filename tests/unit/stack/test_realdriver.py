"""The stack's kustomization for the driver on a real node renders the repository's local
overlay with only this machine's differences: the three node agents and the six cluster
services, on real nodes only, on the host's network, at the kubelet's and the node's own paths,
with this checkout's image."""

from __future__ import annotations

import ipaddress
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from neuron_dra_cli.stack import realdriver
from neuron_dra_cli.stack.layout import Layout
from neuron_dra_cli.stack.pki import Pki

from tests.fixtures.image import skip_unless_required
from tests.fixtures.stack import neuron_dra

NODE = Path("/tmp/ndra-x/real-node-0")


def _setup(*, bus_auth: bool = True) -> realdriver.NodeSetup:
    return realdriver.NodeSetup(
        image="localhost/neuron-dra:0.1.0-abc123",
        nats_url="nats://127.0.0.1:4001",
        apiserver_port=6443,
        kubelet_root=NODE / "kubelet",
        cdi_dir=NODE / "cdi",
        hardware=NODE / "hw",
        plugin_state=NODE / "plugin-state",
        kubelet_healthz_port=4002,
        discovery_port=4003,
        plugin_port=4004,
        service_ports={name: 4005 + i for i, name in enumerate(realdriver.DEPLOYMENTS)},
        probe_port=4020,
        probe_state=NODE / "health-probe",
        alertmanager_url="http://127.0.0.1:4021",
        bus_auth=bus_auth,
    )


def _render(folder: Path, setup: realdriver.NodeSetup) -> list[dict[str, Any]]:
    (folder / "kustomization.yaml").write_text(realdriver.kustomization(setup, folder=folder))
    return realdriver.render(Path("/nowhere/kubeconfig"), folder)


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return _render(tmp_path_factory.mktemp("real-node-driver"), _setup())


@pytest.fixture(scope="module")
def rendered(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The DaemonSets and Deployments, by name."""
    services = [
        "neuron-dra-alerts",
        "neuron-dra-audit",
        "neuron-dra-failure-detector",
        "neuron-dra-slice-publisher",
        "neuron-dra-topology-allocator",
        "neuron-dra-ultraserver-operator",
    ]
    agents = ["neuron-dra-discovery", "neuron-dra-kubelet-plugin", "neuron-dra-health-probe"]
    assert sorted((d["kind"], d["metadata"]["name"]) for d in docs) == sorted(
        [
            ("ConfigMap", "neuron-dra-alerts"),
            *(("DaemonSet", name) for name in agents),
            *(("Deployment", name) for name in services),
            *(("ServiceAccount", name) for name in agents + services),
        ]
    )
    return {d["metadata"]["name"]: d for d in docs if d["kind"] in ("DaemonSet", "Deployment")}


def _pod(ds: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = ds["spec"]["template"]["spec"]
    return spec


def _env(ds: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in _pod(ds)["containers"][0]["env"]}


def test_the_agents_and_the_publisher_run_on_real_nodes_only_on_the_hosts_network(
    rendered: dict[str, dict[str, Any]],
) -> None:
    for ds in rendered.values():
        pod = _pod(ds)
        assert pod["nodeSelector"] == {"neuron-dra.dev/real-node": "true"}
        assert pod["hostNetwork"] is True
        container = pod["containers"][0]
        assert container["image"] == "localhost/neuron-dra:0.1.0-abc123"
        assert container["imagePullPolicy"] == "Never"
        assert _env(ds)["NEURON_DRA_NATS_SERVERS"] == "nats://127.0.0.1:4001"
    assert _pod(rendered["neuron-dra-discovery"])["containers"][0]["ports"] == [
        {"name": "http", "containerPort": 4003}
    ]


@pytest.mark.parametrize(
    ("deployment", "process"),
    [
        ("neuron-dra-slice-publisher", "slice-publisher"),
        ("neuron-dra-topology-allocator", "topology-allocator"),
        ("neuron-dra-ultraserver-operator", "ultraserver-operator"),
        ("neuron-dra-failure-detector", "failure-detector"),
        ("neuron-dra-alerts", "alerts"),
        ("neuron-dra-audit", "audit"),
    ],
)
def test_each_cluster_service_is_its_base_deployment_with_one_replica_and_the_apiservers_address(
    rendered: dict[str, dict[str, Any]], deployment: str, process: str
) -> None:
    obj = rendered[deployment]
    # Two on one node's network would want one port.
    assert obj["spec"]["replicas"] == 1
    pod = _pod(obj)
    assert pod["serviceAccountName"] == deployment
    [container] = pod["containers"]
    # The patch merged into the base's container (same name), not beside it.
    assert container["name"] == process
    assert container["command"] == [f"neuron-dra-{process}"]
    port = 4005 + realdriver.DEPLOYMENTS.index(deployment)
    assert container["ports"] == [{"name": "http", "containerPort": port}]
    assert container["readinessProbe"]["httpGet"]["port"] == "http"
    env = _env(obj)
    assert env["NEURON_DRA_HTTP_PORT"] == str(port)
    assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == ("127.0.0.1", "6443")
    assert container["securityContext"]["runAsNonRoot"] is True
    # The stack starts no process of it then.
    assert process in realdriver.SERVICE_KINDS


def test_the_services_that_lead_keep_the_pods_name_as_their_identity(
    rendered: dict[str, dict[str, Any]],
) -> None:
    for name in ("neuron-dra-slice-publisher", "neuron-dra-ultraserver-operator",
                 "neuron-dra-failure-detector"):  # fmt: skip
        assert _env(rendered[name])["NEURON_DRA_IDENTITY"] == {
            "fieldRef": {"fieldPath": "metadata.name"}
        }
    assert _env(rendered["neuron-dra-slice-publisher"])["NEURON_DRA_LEASE_SECONDS"] == "6"


def test_the_alerts_subscriber_posts_to_the_stacks_alertmanager(
    rendered: dict[str, dict[str, Any]], docs: list[dict[str, Any]]
) -> None:
    env = _env(rendered["neuron-dra-alerts"])
    # Read from the base's ConfigMap, which carries the stack's address.
    assert env["NEURON_DRA_ALERTMANAGER_URL"] == {
        "configMapKeyRef": {"name": "neuron-dra-alerts", "key": "alertmanager-url"}
    }
    [config] = [d for d in docs if d["kind"] == "ConfigMap"]
    assert config["metadata"]["name"] == "neuron-dra-alerts"
    assert config["data"] == {"alertmanager-url": "http://127.0.0.1:4021"}
    assert (env["NEURON_DRA_RESEND_SECONDS"], env["NEURON_DRA_ALERT_TTL_SECONDS"]) == ("30", "120")


def test_the_health_probe_reads_the_nodes_simulated_hardware_and_kernel_log(
    rendered: dict[str, dict[str, Any]],
) -> None:
    probe = rendered["neuron-dra-health-probe"]
    env = _env(probe)
    assert env["NEURON_DRA_KERNEL_LOG"] == "/host/var/log/kern.log"
    assert env["NEURON_DRA_POLL_SECONDS"] == "1"
    assert env["NEURON_DRA_HOST_ROOT"] == "/host"  # the base's own
    assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == ("127.0.0.1", "6443")
    [container] = _pod(probe)["containers"]
    assert container["ports"] == [{"name": "http", "containerPort": 4020}]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {
        "sys": "/host/sys",
        "dev": "/host/dev",
        "state": "/var/lib/neuron-dra/health-probe",
        "kernel-log": "/host/var/log",
        "bus-token": "/var/run/secrets/neuron-dra/bus",
    }
    hosts = {v["name"]: v["hostPath"]["path"] for v in _pod(probe)["volumes"] if "hostPath" in v}
    assert hosts == {
        "sys": str(NODE / "hw" / "sys"),
        "dev": str(NODE / "hw" / "dev"),
        "state": str(NODE / "health-probe"),
        "kernel-log": str(NODE / "hw" / "var" / "log"),
    }


def test_the_plugin_uses_the_kubelets_paths_and_the_apiservers_address(
    rendered: dict[str, dict[str, Any]],
) -> None:
    plugin = rendered["neuron-dra-kubelet-plugin"]
    env = _env(plugin)
    assert env["NEURON_DRA_KUBELET_ROOT"] == str(NODE / "kubelet")
    assert env["NEURON_DRA_DEV_ROOT"] == str(NODE / "hw" / "dev")
    assert env["NEURON_DRA_POD_UID"] == ""
    assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == ("127.0.0.1", "6443")
    mounts = {(m["name"], m["mountPath"]) for m in _pod(plugin)["containers"][0]["volumeMounts"]}
    assert ("plugins", str(NODE / "kubelet" / "plugins")) in mounts
    assert ("registry", str(NODE / "kubelet" / "plugins_registry")) in mounts
    hosts = {v["name"]: v["hostPath"]["path"] for v in _pod(plugin)["volumes"] if "hostPath" in v}
    assert hosts["cdi"] == str(NODE / "cdi")
    assert hosts["dev"] == str(NODE / "hw" / "dev")
    assert hosts["state"] == str(NODE / "plugin-state")


def test_on_an_open_bus_the_agents_get_no_bus_token_and_are_told_so(tmp_path: Path) -> None:
    docs = _render(tmp_path, _setup(bus_auth=False))
    workloads = {d["metadata"]["name"]: d for d in docs if d["kind"] in ("DaemonSet", "Deployment")}
    assert sorted(workloads) == sorted(realdriver.DAEMONSETS + realdriver.DEPLOYMENTS)
    for ds in workloads.values():
        env = _env(ds)
        assert "NEURON_DRA_NATS_TOKEN_FILE" not in env
        assert "NEURON_DRA_NATS_TLS_CA" not in env
        assert env["NEURON_DRA_INSECURE_BUS"] == "1"
        assert env["NEURON_DRA_NATS_SERVERS"] == "nats://127.0.0.1:4001"
        assert "bus-token" not in {v["name"] for v in _pod(ds).get("volumes", [])}
        mounts = {m["name"] for m in _pod(ds)["containers"][0].get("volumeMounts", [])}
        assert "bus-token" not in mounts


def test_on_the_authenticated_bus_each_agent_reads_its_projected_token_and_natss_ca(
    tmp_path: Path,
) -> None:
    docs = _render(tmp_path, _setup())
    workloads = {d["metadata"]["name"]: d for d in docs if d["kind"] in ("DaemonSet", "Deployment")}
    assert sorted(workloads) == sorted(realdriver.DAEMONSETS + realdriver.DEPLOYMENTS)
    for ds in workloads.values():
        env = _env(ds)
        assert env["NEURON_DRA_NATS_TOKEN_FILE"] == "/var/run/secrets/neuron-dra/bus/token"
        assert env["NEURON_DRA_NATS_TLS_CA"] == "/var/run/secrets/neuron-dra/bus/ca.crt"
        # The stack's own patches still apply beside the component's.
        assert env["NEURON_DRA_NATS_SERVERS"] == "nats://127.0.0.1:4001"
        assert _pod(ds)["hostNetwork"] is True
        volume = next(v for v in _pod(ds)["volumes"] if v["name"] == "bus-token")
        assert volume["projected"]["sources"] == [
            {"serviceAccountToken": {"audience": "neuron-dra-bus", "expirationSeconds": 3600,
                                     "path": "token"}},
            {"secret": {"name": "neuron-dra-nats-tls",
                        "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        ]  # fmt: skip


def test_natss_secret_holds_a_certificate_for_the_address_the_agents_dial(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    secret = realdriver.nats_tls_secret(pki)
    assert (secret["type"], secret["metadata"]) == (
        "kubernetes.io/tls",
        {"name": "neuron-dra-nats-tls", "namespace": "neuron-dra-driver"},
    )
    data = secret["stringData"]
    assert sorted(data) == ["ca.crt", "tls.crt", "tls.key"]
    ca = x509.load_pem_x509_certificate(data["ca.crt"].encode())
    cert = x509.load_pem_x509_certificate(data["tls.crt"].encode())
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    # _setup's NATS address, where the agents on the host's network dial it.
    assert ipaddress.ip_address("127.0.0.1") in names.get_values_for_type(x509.IPAddress)


def test_the_simulated_devices_are_character_devices(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        skip_unless_required("the real node's character devices need root (mknod)")
    layout = Layout(tmp_path)
    try:
        sim = realdriver.write_hardware(layout, "real-node-0")
        nodes = sorted((sim.root.resolve() / "dev").glob("neuron*"))
    finally:
        layout.short_nodes.unlink(missing_ok=True)  # the alias it made in the temp dir
    assert len(nodes) == 16
    for node in nodes:
        mode = node.stat().st_mode
        assert stat.S_ISCHR(mode)
        index = int(node.name.removeprefix("neuron"))
        assert os.major(node.stat().st_rdev) == realdriver.DEVICE_MAJOR
        assert os.minor(node.stat().st_rdev) == index


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        ([], "exactly one real node (--real-nodes 1, not 0)"),
        (["--real-nodes", "2"], "exactly one real node (--real-nodes 1, not 2)"),
    ],
)
def test_dev_up_refuses_the_driver_on_other_than_one_real_node(
    tmp_path: Path, flags: list[str], said: str
) -> None:
    # Refused before anything else, on any machine (one that cannot run a real node too).
    proc = neuron_dra("dev", "up", "--real-node-driver", *flags, "--state-dir", str(tmp_path))
    assert proc.returncode == 2
    assert said in proc.stderr
    assert not (tmp_path / "state.json").exists()
