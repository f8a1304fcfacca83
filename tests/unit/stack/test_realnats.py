"""NATS on the real node is the local overlay's StatefulSet with only this machine's
differences: the real node, its network, the stack's ports, and a volume made for its claim."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from neuron_dra_cli.stack import realnats


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    folder = tmp_path_factory.mktemp("real-node-nats")
    (folder / "kustomization.yaml").write_text(
        realnats.kustomization(folder=folder, port=4101, monitor_port=4102)
    )
    docs = realnats.render(Path("/nowhere/kubeconfig"), folder)
    assert sorted(d["kind"] for d in docs) == ["ConfigMap", "StatefulSet"]
    return {d["kind"]: d for d in docs}


def test_the_server_runs_on_the_real_node_on_its_network_at_the_stacks_ports(
    rendered: dict[str, dict[str, Any]],
) -> None:
    sts = rendered["StatefulSet"]
    pod = sts["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"neuron-dra.dev/real-node": "true"}
    assert pod["hostNetwork"] is True
    [container] = pod["containers"]
    assert container["image"] == "localhost/nats:2.14.6"
    assert container["imagePullPolicy"] == "Never"
    assert container["args"] == [
        "--config", "/etc/nats/nats.conf", "--port", "4101", "--http_port", "4102",
    ]  # fmt: skip
    assert container["ports"] == [
        {"name": "client", "containerPort": 4101},
        {"name": "monitor", "containerPort": 4102},
    ]


def test_the_rest_is_the_base_as_written(rendered: dict[str, dict[str, Any]]) -> None:
    sts = rendered["StatefulSet"]
    [container] = sts["spec"]["template"]["spec"]["containers"]
    # The preStop hook and the user are the base's.
    assert "ldm" in " ".join(container["lifecycle"]["preStop"]["exec"]["command"])
    security = sts["spec"]["template"]["spec"]["securityContext"]
    assert (security["runAsUser"], security["runAsGroup"]) == (65532, 65532)
    # The configuration it mounts is the ConfigMap rendered beside it.
    config = next(v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "config")
    assert config["configMap"]["name"] == rendered["ConfigMap"]["metadata"]["name"]
    assert "jetstream" in rendered["ConfigMap"]["data"]["nats.conf"]


def test_the_volume_is_made_for_the_statefulsets_claim_with_its_size(
    rendered: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    pv = realnats.volume(rendered["StatefulSet"], tmp_path)
    spec = pv["spec"]
    # The claim the StatefulSet makes for its pod nats-0, from its template "data" of 10Gi.
    assert pv["metadata"]["name"] == "neuron-dra-data-nats-0"
    assert spec["claimRef"] == {"namespace": "neuron-dra-driver", "name": "data-nats-0"}
    assert spec["capacity"] == {"storage": "10Gi"}
    assert spec["accessModes"] == ["ReadWriteOnce"]
    assert spec["hostPath"] == {"path": str(tmp_path.resolve()), "type": "Directory"}
    assert spec["persistentVolumeReclaimPolicy"] == "Retain"


def test_the_open_bus_server_needs_none_of_the_bus_auth_secrets(
    rendered: dict[str, dict[str, Any]],
) -> None:
    pod = rendered["StatefulSet"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert [e["name"] for e in container["env"]] == ["POD_NAME"]
    assert {m["name"] for m in container["volumeMounts"]} == {"config", "data"}
    assert [v["name"] for v in pod["volumes"]] == ["config"]
    assert not pod.get("initContainers")


def test_the_probes_ask_the_monitoring_port_on_the_loopback(
    rendered: dict[str, dict[str, Any]],
) -> None:
    [container] = rendered["StatefulSet"]["spec"]["template"]["spec"]["containers"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        command = container[probe]["exec"]["command"]
        assert command[0] == "python3"
        assert command[-1].startswith("http://127.0.0.1:4102/healthz"), command
