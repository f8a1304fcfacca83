"""The stack's kustomization for the device plugin on a real node renders the repository's
device-plugin component with only this machine's differences (host network, the simulated
hardware's paths, this checkout's image), and kube-scheduler gets the scheduler-extender
component's configuration pointed at the stack's extender."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from neuron_dra_cli.stack import realdeviceplugin

from tests.fixtures.stack import neuron_dra

NODE = Path("/tmp/ndra-x/real-node-0")


def render(folder: Path, *, bus_auth: bool = False) -> dict[tuple[str, str], dict[str, Any]]:
    setup = realdeviceplugin.PluginSetup(
        image="localhost/neuron-dra:0.1.0-abc123",
        nats_url="nats://127.0.0.1:4001",
        apiserver_port=6443,
        hardware=NODE / "hw",
        http_port=4005,
        bus_auth=bus_auth,
    )
    (folder / "kustomization.yaml").write_text(realdeviceplugin.kustomization(setup, folder=folder))
    docs = realdeviceplugin.render(Path("/nowhere/kubeconfig"), folder)
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], dict[str, Any]]:
    return render(tmp_path_factory.mktemp("real-node-device-plugin"))


def _env(daemonset: dict[str, Any]) -> dict[str, str]:
    [container] = daemonset["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", "") for e in container["env"]}


def test_on_the_authenticated_bus_the_plugin_presents_its_projected_bus_token(
    tmp_path: Path, rendered: dict[tuple[str, str], dict[str, Any]]
) -> None:
    name = ("DaemonSet", "neuron-dra-device-plugin")
    plain = rendered[name]
    # On the open bus (--insecure-bus) it has no token and is told the bus is open.
    assert "NEURON_DRA_NATS_TOKEN_FILE" not in _env(plain)
    assert _env(plain)["NEURON_DRA_INSECURE_BUS"] == "1"
    authed = render(tmp_path, bus_auth=True)[name]
    env = _env(authed)
    assert "NEURON_DRA_INSECURE_BUS" not in env
    assert env["NEURON_DRA_NATS_TOKEN_FILE"] == "/var/run/secrets/neuron-dra/bus/token"
    assert env["NEURON_DRA_NATS_TLS_CA"] == "/var/run/secrets/neuron-dra/bus/ca.crt"
    # This machine's patches stay.
    assert env["NEURON_DRA_NATS_SERVERS"] == "nats://127.0.0.1:4001"
    assert authed["spec"]["template"]["spec"]["hostNetwork"] is True
    [volume] = [
        v for v in authed["spec"]["template"]["spec"]["volumes"] if v["name"] == "bus-token"
    ]
    sources = volume["projected"]["sources"]
    assert sources[0]["serviceAccountToken"]["audience"] == "neuron-dra-bus"
    assert sources[1]["secret"]["name"] == "neuron-dra-nats-tls"


def test_the_component_renders_whole_with_the_image_imported(
    rendered: dict[tuple[str, str], dict[str, Any]],
) -> None:
    name = "neuron-dra-device-plugin"
    assert sorted(rendered) == [
        ("ClusterRole", name),
        ("ClusterRoleBinding", name),
        ("DaemonSet", name),
        ("ServiceAccount", name),
    ]
    container = rendered[("DaemonSet", name)]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "localhost/neuron-dra:0.1.0-abc123"
    assert container["imagePullPolicy"] == "Never"
    assert container["ports"] == [{"name": "http", "containerPort": 4005}]


def test_the_plugin_keeps_its_node_selection_and_the_device_managers_folder(
    rendered: dict[tuple[str, str], dict[str, Any]],
) -> None:
    pod = rendered[("DaemonSet", "neuron-dra-device-plugin")]["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {
            "matchExpressions": [
                {
                    "key": "neuron.aws.com/device-management",
                    "operator": "In",
                    "values": ["device-plugin"],
                }
            ]
        }
    ]
    assert realdeviceplugin.NODE_LABELS["neuron.aws.com/device-management"] == "device-plugin"
    assert pod["hostNetwork"] is True
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["NEURON_DRA_NATS_SERVERS"] == "nats://127.0.0.1:4001"
    assert env["NEURON_DRA_KUBELET_ROOT"] == "/var/lib/kubelet"
    assert env["NEURON_DRA_DEV_ROOT"] == str(NODE / "hw" / "dev")
    assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == ("127.0.0.1", "6443")
    hosts = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    assert hosts == {
        "device-plugins": "/var/lib/kubelet/device-plugins",
        "sys": str(NODE / "hw" / "sys"),
        "dev": str(NODE / "hw" / "dev"),
        "neuron": str(NODE / "hw" / "opt" / "aws" / "neuron"),
    }


def test_the_scheduler_calls_the_stacks_extender_for_the_neuron_resources(
    tmp_path: Path,
) -> None:
    source = yaml.safe_load(realdeviceplugin.SCHEDULER_CONFIG.read_text())
    tls = realdeviceplugin.extender_tls(tmp_path / "pki")
    config = realdeviceplugin.scheduler_config(
        source, extender_url="https://127.0.0.1:4006", tls=tls
    )
    [extender] = config["extenders"]
    assert extender["urlPrefix"] == "https://127.0.0.1:4006"
    assert extender["bindVerb"] == "bind"
    assert [r["name"] for r in extender["managedResources"]] == [
        "aws.amazon.com/neuron",
        "aws.amazon.com/neurondevice",
        "aws.amazon.com/neuroncore",
    ]
    # The stack's own certificates, checked for the name the component's configuration uses.
    assert extender["tlsConfig"] == {
        "serverName": "neuron-dra-scheduler-extender.neuron-dra-driver.svc",
        "certFile": str(tls.client.cert),
        "keyFile": str(tls.client.key),
        "caFile": str(tls.ca),
    }
    # The component's file is left as it is.
    assert source["extenders"][0]["urlPrefix"] == "https://10.96.0.32:12345"


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        ([], "--real-node-device-plugin runs the device plugin on exactly one real node "
         "(--real-nodes 1, not 0)"),
        (["--real-nodes", "2"], "(--real-nodes 1, not 2): the kubelet's device manager "
         "listens in /var/lib/kubelet/device-plugins"),
        (["--real-nodes", "1", "--real-node-driver"],
         "--real-node-device-plugin does not go with --real-node-driver"),
    ],
)  # fmt: skip
def test_dev_up_refuses_the_device_plugin_but_on_one_real_node_alone(
    tmp_path: Path, flags: list[str], said: str
) -> None:
    # Refused before anything else, on any machine (one that cannot run a real node too).
    proc = neuron_dra(
        "dev", "up", "--real-node-device-plugin", *flags, "--state-dir", str(tmp_path)
    )
    assert proc.returncode == 2
    assert said in proc.stderr
    assert not (tmp_path / "state.json").exists()
