"""What a real node's containerd, CNI bridge and kubelet are configured with."""

from __future__ import annotations

import ipaddress
import json
import tomllib
from pathlib import Path

import pytest
import yaml
from neuron_dra_cli.main import build_parser
from neuron_dra_cli.stack import realconfig, realnodes
from neuron_dra_cli.toolbuild import CONTAINERD

REPO = Path(__file__).resolve().parents[3]
BASE = Path("/tmp/ndra-0123456789/real-node-0")
PATHS = realconfig.NodePaths(BASE)


def test_containerd_keeps_everything_under_the_nodes_folder() -> None:
    conf = tomllib.loads(realconfig.containerd_config(paths=PATHS, stream_port=4321))
    assert conf["version"] == 3
    assert conf["root"] == str(BASE / "containerd" / "root")
    assert conf["state"] == str(BASE / "containerd" / "state")
    assert conf["grpc"]["address"] == str(PATHS.socket)
    assert conf["ttrpc"]["address"] == f"{PATHS.socket}.ttrpc"
    # The host-wide NRI socket and /opt/containerd would clash between two nodes.
    assert {"io.containerd.nri.v1.nri", "io.containerd.internal.v1.opt"} <= set(
        conf["disabled_plugins"]
    )
    runtime = conf["plugins"]["io.containerd.cri.v1.runtime"]
    assert runtime["cdi_spec_dirs"] == [str(BASE / "cdi")]
    assert runtime["netns_mounts_under_state_dir"] is True
    assert runtime["cni"] == {"bin_dirs": ["/usr/lib/cni"], "conf_dir": str(BASE / "cni/net.d")}
    server = conf["plugins"]["io.containerd.grpc.v1.cri"]
    assert (server["stream_server_address"], server["stream_server_port"]) == ("127.0.0.1", "4321")


def test_containerd_runs_debians_runc_as_the_hand_check_on_these_hosts_did() -> None:
    conf = tomllib.loads(realconfig.containerd_config(paths=PATHS, stream_port=1))
    runtime = conf["plugins"]["io.containerd.cri.v1.runtime"]
    # Without it runc fails with "can't get final child's PID from pipe".
    assert runtime["restrict_oom_score_adj"] is True
    runc = runtime["containerd"]["runtimes"]["runc"]
    assert runc["runtime_type"] == "io.containerd.runc.v2"
    assert runc["options"] == {
        "BinaryName": "/usr/sbin/runc",
        "SystemdCgroup": False,
        "Root": str(BASE / "containerd" / "runc"),
    }
    pinned = conf["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]
    assert pinned == {"sandbox": "localhost/neuron-dra-pause:3.10.2"}


def test_each_real_node_of_each_stack_has_its_own_bridge_and_subnet() -> None:
    a0 = realconfig.network(stack_id="/srv/a/state", index=0)
    a1 = realconfig.network(stack_id="/srv/a/state", index=1)
    b0 = realconfig.network(stack_id="/srv/b/state", index=0)
    assert len({a0.bridge, a1.bridge, b0.bridge}) == 3
    assert a0.subnet != a1.subnet
    for net in (a0, a1, b0):
        assert len(net.bridge) <= 15  # Linux's limit on an interface name
        subnet = ipaddress.ip_network(net.subnet)
        assert ipaddress.ip_address(net.gateway) in subnet
        # podman's default network is 10.88.0.0/16.
        assert not subnet.overlaps(ipaddress.ip_network("10.88.0.0/16"))
    assert realconfig.network(stack_id="/srv/a/state", index=0) == a0


def test_the_cni_bridge_leases_addresses_from_the_nodes_subnet_into_its_folder() -> None:
    net = realconfig.network(stack_id="/srv/a/state", index=0)
    conf = json.loads(realconfig.cni_config(paths=PATHS, net=net))
    bridge, loopback = conf["plugins"]
    assert loopback == {"type": "loopback"}
    assert (bridge["type"], bridge["bridge"], bridge["isGateway"]) == ("bridge", net.bridge, True)
    assert bridge["ipMasq"] is False  # no iptables rules left behind
    assert bridge["ipam"]["ranges"] == [[{"subnet": net.subnet, "gateway": net.gateway}]]
    assert bridge["ipam"]["dataDir"] == str(BASE / "cni" / "ipam")


def test_the_kubelet_is_configured_for_these_hosts_and_reachable_at_the_node_ip() -> None:
    tls = realconfig.KubeletTls(cert=Path("/p/k.crt"), key=Path("/p/k.key"), client_ca=Path("/ca"))
    conf = yaml.safe_load(
        realconfig.kubelet_config(
            paths=PATHS, tls=tls, address="10.150.0.1", port=10250, healthz_port=10248
        )
    )
    assert conf["kind"] == "KubeletConfiguration"
    assert {k: conf[k] for k in ("failCgroupV1", "cgroupDriver", "cgroupsPerQOS")} == {
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": False,
    }
    assert conf["enforceNodeAllocatable"] == []
    assert conf["failSwapOn"] is False
    assert conf["localStorageCapacityIsolation"] is False
    assert conf["containerRuntimeEndpoint"] == f"unix://{PATHS.socket}"
    assert (conf["address"], conf["port"], conf["readOnlyPort"]) == ("10.150.0.1", 10250, 0)
    assert (conf["healthzBindAddress"], conf["healthzPort"]) == ("127.0.0.1", 10248)
    assert conf["authentication"]["x509"] == {"clientCAFile": "/ca"}
    assert conf["authentication"]["anonymous"] == {"enabled": False}
    assert conf["imageGCHighThresholdPercent"] == 100  # imported images cannot be pulled back
    assert conf["podLogsDir"].startswith(str(BASE))
    argv = realconfig.kubelet_argv(
        binary=Path("/bin/kubelet"),
        paths=PATHS,
        kubeconfig=Path("/k.yaml"),
        name="real-node-0",
        node_ip="10.150.0.1",
        labels={realconfig.REAL_NODE_LABEL: "true"},
    )
    assert "--node-ip=10.150.0.1" in argv
    assert "--hostname-override=real-node-0" in argv
    assert f"--root-dir={BASE / 'kubelet'}" in argv
    assert "--node-labels=neuron-dra.dev/real-node=true" in argv


def test_real_node_names_are_not_fleet_names() -> None:
    assert [realconfig.node_name(i) for i in range(2)] == ["real-node-0", "real-node-1"]


def test_containerd_is_pinned_by_version_and_checksum() -> None:
    module_dir = REPO / "tools" / "containerd"
    assert CONTAINERD.version(module_dir) == "v2.4.2"
    assert "github.com/containerd/containerd/v2 v2.4.2 h1:" in (module_dir / "go.sum").read_text()
    tools = (module_dir / "tools.go").read_text()
    for package in (CONTAINERD.package, *CONTAINERD.also):
        assert f'_ "{package}"' in tools
    assert CONTAINERD.go_flags("v2.4.2")[-1].endswith(
        "-X github.com/containerd/containerd/v2/version.Version=v2.4.2"
    )


def test_dev_up_takes_a_count_of_real_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    assert build_parser().parse_args(["dev", "up"]).real_nodes == 0
    assert build_parser().parse_args(["dev", "up", "--real-nodes", "2"]).real_nodes == 2
    with pytest.raises(SystemExit):
        build_parser().parse_args(["dev", "up", "--real-nodes", "-1"])
    assert (
        "'-1' (from --real-nodes or NEURON_DRA_REAL_NODES) is negative" in capsys.readouterr().err
    )


def test_real_nodes_without_runc_or_cni_plugins_are_refused_naming_each(tmp_path: Path) -> None:
    (tmp_path / "bridge").write_text("")  # there, but not executable
    with pytest.raises(realnodes.RealNodeError) as refused:
        realnodes.check_requirements(1, runc=tmp_path / "runc", cni_bin_dir=tmp_path)
    message = str(refused.value)
    assert message.startswith("--real-nodes 1 needs: ")
    assert f"runc at {tmp_path / 'runc'} (Debian: apt-get install runc)" in message
    for plugin in ("bridge", "host-local", "loopback"):
        assert f"the CNI plugin {tmp_path / plugin} (Debian: apt-get install " in message
    assert message.endswith("run the stack with simulated nodes only (--real-nodes 0).")
    # No real node asked for: nothing is required.
    realnodes.check_requirements(0, runc=tmp_path / "runc", cni_bin_dir=tmp_path)
