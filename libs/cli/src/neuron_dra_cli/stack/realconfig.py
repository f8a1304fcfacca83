"""What a real node's containerd, CNI and kubelet are configured with (pure: no I/O).

A real node is the real kubelet with containerd, runc (Debian's) and the bridge CNI plugin
(Debian's, in ``/usr/lib/cni``), beside the simulated nodes. Everything a node keeps lives
under its own folder (``NodePaths``), so several nodes and several stacks run side by side,
and ``dev down`` finds all of it. Why each setting is there is said where it is set.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

#: The pause image: ``build/pause/linux/pause.c`` of the pinned Kubernetes module, static,
#: in an image of its own (nothing can be pulled here). Its tag is the upstream pause tag.
PAUSE_IMAGE = "localhost/neuron-dra-pause:3.10.2"
RUNC = Path("/usr/sbin/runc")
CNI_BIN_DIR = Path("/usr/lib/cni")
#: The containerd namespace the CRI plugin (so the kubelet) uses.
K8S_NAMESPACE = "k8s.io"
#: Marks the real nodes apart from the simulated ones (``kubectl get nodes -l ...``).
REAL_NODE_LABEL = "neuron-dra.dev/real-node"
NAME_PREFIX = "real-node-"


def node_name(index: int) -> str:
    """``real-node-0``, ``real-node-1``, ...: never a simulated node's name (the fleet's
    names are instance names such as ``trn2-0``)."""
    return f"{NAME_PREFIX}{index}"


@dataclass(frozen=True)
class NodePaths:
    """Where one real node keeps everything, under ``base`` (its folder)."""

    base: Path

    @property
    def containerd_root(self) -> Path:
        return self.base / "containerd" / "root"

    @property
    def containerd_state(self) -> Path:
        return self.base / "containerd" / "state"

    @property
    def socket(self) -> Path:
        return self.base / "containerd" / "containerd.sock"

    @property
    def containerd_config(self) -> Path:
        return self.base / "containerd" / "config.toml"

    @property
    def runc_root(self) -> Path:
        return self.base / "containerd" / "runc"

    @property
    def cni_conf_dir(self) -> Path:
        return self.base / "cni" / "net.d"

    @property
    def cni_data_dir(self) -> Path:
        return self.base / "cni" / "ipam"

    @property
    def cdi_dir(self) -> Path:
        return self.base / "cdi"

    @property
    def kubelet_root(self) -> Path:
        return self.base / "kubelet"

    @property
    def kubelet_config(self) -> Path:
        return self.base / "kubelet-config.yaml"

    @property
    def pod_logs(self) -> Path:
        return self.base / "pod-logs"


@dataclass(frozen=True)
class Network:
    """One node's pod network: a bridge of its own and a /24 of its own."""

    bridge: str
    subnet: str
    #: The bridge's own address: also the node's InternalIP, where its kubelet listens
    #: (the kubelet refuses a loopback node IP, and this one is on the host before any pod).
    gateway: str
    prefix_length: int = 24


def network(*, stack_id: str, index: int) -> Network:
    """The pod network of real node ``index`` of the stack ``stack_id`` (its state dir).

    The bridge's name carries a digest of the stack, so two stacks never share one and
    ``dev down`` deletes only its own; Linux allows 15 characters. The subnets avoid
    podman's default 10.88.0.0/16.
    """
    digest = hashlib.sha256(stack_id.encode()).digest()
    bridge = f"ndra{digest.hex()[:7]}{index}"[:15]
    second = 100 + digest[0] % 100
    third = index % 256
    return Network(
        bridge=bridge,
        subnet=f"10.{second}.{third}.0/24",
        gateway=f"10.{second}.{third}.1",
    )


def _toml_str(value: str | Path) -> str:
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def containerd_config(*, paths: NodePaths, stream_port: int) -> str:
    """containerd's config (version 3): its own root, state and sockets; CRI with runc from
    Debian, the node's CNI and CDI folders, and the local pause image."""
    runtime = 'plugins."io.containerd.cri.v1.runtime"'
    return "\n".join(
        [
            "version = 3",
            f"root = {_toml_str(paths.containerd_root)}",
            f"state = {_toml_str(paths.containerd_state)}",
            # NRI listens on one fixed host socket, and /opt/containerd is shared by every
            # containerd on the host: neither is used here, and each would clash with
            # another node's containerd.
            'disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.internal.v1.opt"]',
            "",
            "[grpc]",
            f"  address = {_toml_str(paths.socket)}",
            "",
            "[ttrpc]",
            f"  address = {_toml_str(str(paths.socket) + '.ttrpc')}",
            "",
            f"[{runtime}]",
            # CDI is always on in containerd 2.x (``enable_cdi`` is gone); the dirs are the
            # node's own, where a DRA driver on this node writes its specs.
            f"  cdi_spec_dirs = [{_toml_str(paths.cdi_dir)}]",
            # The sandbox may not lower its oom_score_adj below the daemon's; without this
            # runc fails with "can't get final child's PID from pipe".
            "  restrict_oom_score_adj = true",
            # Network namespaces under the node's state, not /var/run/netns: `dev down`
            # unmounts everything under the node's folder.
            "  netns_mounts_under_state_dir = true",
            "",
            f"[{runtime}.cni]",
            f"  bin_dirs = [{_toml_str(CNI_BIN_DIR)}]",
            f"  conf_dir = {_toml_str(paths.cni_conf_dir)}",
            "",
            f"[{runtime}.containerd.runtimes.runc]",
            '  runtime_type = "io.containerd.runc.v2"',
            "",
            f"[{runtime}.containerd.runtimes.runc.options]",
            f"  BinaryName = {_toml_str(RUNC)}",
            # The kubelet runs with the cgroupfs driver (no systemd on these hosts).
            "  SystemdCgroup = false",
            f"  Root = {_toml_str(paths.runc_root)}",
            "",
            '[plugins."io.containerd.cri.v1.images".pinned_images]',
            # Nothing can be pulled: the sandbox is the local pause image, imported first.
            f"  sandbox = {_toml_str(PAUSE_IMAGE)}",
            "",
            '[plugins."io.containerd.grpc.v1.cri"]',
            # `kubectl exec/attach/port-forward` stream through here, via the kubelet.
            '  stream_server_address = "127.0.0.1"',
            f'  stream_server_port = "{stream_port}"',
            "",
        ]
    )


def cni_config(*, paths: NodePaths, net: Network) -> str:
    """The node's CNI network list: a bridge with host-local addresses, and loopback."""
    conf = {
        "cniVersion": "1.0.0",
        "name": net.bridge,
        "plugins": [
            {
                "type": "bridge",
                "bridge": net.bridge,
                # The host reaches its pods through the bridge (the kubelet's probes).
                "isGateway": True,
                # No masquerading: no iptables rules to leave behind; pods need only the host.
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": net.subnet, "gateway": net.gateway}]],
                    # Not /var/lib/cni: the node's leases go with the node.
                    "dataDir": str(paths.cni_data_dir),
                },
            },
            {"type": "loopback"},
        ],
    }
    return json.dumps(conf, indent=2) + "\n"


@dataclass(frozen=True)
class KubeletTls:
    """The kubelet's serving pair (signed by the stack's CA, for 127.0.0.1) and the CA
    that client certificates (the apiserver's) must chain to."""

    cert: Path
    key: Path
    client_ca: Path


def kubelet_config(
    *, paths: NodePaths, tls: KubeletTls, address: str, port: int, healthz_port: int
) -> str:
    """The KubeletConfiguration of a real node on these hosts (as JSON, which is YAML);
    its API on ``address`` (the node's IP), its health on loopback."""
    conf: dict[str, object] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": address,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "containerRuntimeEndpoint": f"unix://{paths.socket}",
        # `kubectl logs/exec` reach the kubelet through the apiserver, which checks the
        # kubelet's certificate against the stack's CA and presents its own client one.
        "tlsCertFile": str(tls.cert),
        "tlsPrivateKeyFile": str(tls.key),
        "authentication": {
            "x509": {"clientCAFile": str(tls.client_ca)},
            "webhook": {"enabled": False},
            "anonymous": {"enabled": False},
        },
        # Only clients with a certificate of the stack's CA get here, on loopback.
        "authorization": {"mode": "AlwaysAllow"},
        # These hosts: cgroup v1 or hybrid, no systemd, swap maybe on, no writable
        # top-level cgroups for QoS classes, no local-storage accounting.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "failSwapOn": False,
        "localStorageCapacityIsolation": False,
        # A busy shared disk must not evict the node's pods or taint it DiskPressure, and
        # image garbage collection must not delete the imported images (nothing can be
        # pulled back): only memory eviction stays, and image GC is off (100 %).
        "evictionHard": {"memory.available": "1Mi"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        # Nothing of the node's under the host's /var/log/pods or /usr/libexec.
        "podLogsDir": str(paths.pod_logs),
        "volumePluginDir": str(paths.kubelet_root / "volume-plugins"),
        "clusterDomain": "cluster.local",
        "registerNode": True,
    }
    return json.dumps(conf, indent=2) + "\n"


def kubelet_argv(
    *,
    binary: Path,
    paths: NodePaths,
    kubeconfig: Path,
    name: str,
    node_ip: str,
    labels: dict[str, str],
) -> list[str]:
    """The kubelet's command line (everything else is in its config file)."""
    return [
        str(binary),
        f"--config={paths.kubelet_config}",
        f"--kubeconfig={kubeconfig}",
        f"--root-dir={paths.kubelet_root}",
        f"--cert-dir={paths.kubelet_root / 'pki'}",
        f"--hostname-override={name}",
        # The apiserver reaches the kubelet at the node's InternalIP for logs and exec.
        f"--node-ip={node_ip}",
        f"--node-labels={','.join(f'{k}={v}' for k, v in sorted(labels.items()))}",
        "--v=1",
    ]
