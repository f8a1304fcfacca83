"""The product's own DaemonSets on the real nodes (``dev up --real-nodes N --real-node-driver``).

Discovery, the kubelet plugin and the health probe run there as real containers, and so do
the cluster services (the slice publisher, the topology allocator, the UltraServer operator,
the failure detector, and the alerts and audit subscribers, each with its manifests'
ServiceAccount, RBAC and admission policy), from the very manifests a cluster gets
(``deploy/kustomize/overlays/local`` with the simulated-hardware component): the stack writes
only a small kustomization of its own that references that overlay and patches what differs
on this machine, never a second copy of the pod specs:

- the nodes: only the real ones (the simulated nodes keep their agent processes, and the
  services' Deployments, one replica each here, run there and serve them all; the stack
  starts no process of those services);
- the network: all on the host's network, so NATS and the apiserver (on the host's
  loopback: NATS the stack's process on the authenticated bus, or with ``--insecure-bus``
  the overlay's StatefulSet on the same node, see ``realnats``) are reached at the stack's
  own addresses, and each HTTP port is a free one;
- the paths: the real kubelet's root, its node's CDI folder (containerd reads it) and the
  node's simulated hardware, all under the node's folder.

The bus is authenticated as on a cluster (the base lists the ``bus-auth`` component): the
kubelet projects each pod's ServiceAccount token for the bus and the CA of the Secret
``neuron-dra-nats-tls``, which the stack makes from its PKI (see :func:`nats_tls_secret`).
The pods dial NATS at the host's loopback, which its certificate names. With
``--insecure-bus`` the kustomization takes the token and the CA out again and tells each
service that the bus is open.

Each real node is a trn2.48xlarge with simulated hardware, whose device nodes are
character devices (see :func:`write_hardware`).
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml
from neuron_dra_common.hardware.layout import NodePaths as HardwarePaths
from neuron_dra_common.hardware.simulate import SimNode, write_node

from neuron_dra_cli import imagebuild
from neuron_dra_cli.errors import CliError
from neuron_dra_cli.stack import kubectl, process, realconfig, realnodes
from neuron_dra_cli.stack.layout import Layout
from neuron_dra_cli.stack.pki import Pki
from neuron_dra_cli.toolbuild import ContainerdBinaries

__all__ = [
    "DAEMONSETS",
    "DEPLOYMENTS",
    "INSTANCE_TYPE",
    "LOCAL_OVERLAY",
    "SERVICES",
    "SERVICE_KINDS",
    "NodeSetup",
    "apply",
    "kustomization",
    "nats_tls_secret",
    "wait_ready",
    "workload_patch",
    "write_hardware",
]

Progress = Callable[[str], None]

REPO = Path(__file__).resolve().parents[5]
LOCAL_OVERLAY = REPO / "deploy" / "kustomize" / "overlays" / "local"
NAMESPACE: Final = "neuron-dra-driver"
DISCOVERY: Final = "neuron-dra-discovery"
PLUGIN: Final = "neuron-dra-kubelet-plugin"
HEALTH_PROBE: Final = "neuron-dra-health-probe"
DAEMONSETS: Final = (DISCOVERY, PLUGIN, HEALTH_PROBE)
PUBLISHER: Final = "neuron-dra-slice-publisher"
ALERTS: Final = "neuron-dra-alerts"
#: The cluster services' Deployments run on the real node: each one's container (named as
#: the stack's process of that service is, which the stack then does not start) and what
#: the stack's process is given beyond the manifests' settings.
SERVICES: Final[Mapping[str, tuple[str, Mapping[str, str]]]] = {
    # A successor leads soon, as with the stack's own process.
    PUBLISHER: ("slice-publisher", {"NEURON_DRA_LEASE_SECONDS": "6"}),
    "neuron-dra-topology-allocator": ("topology-allocator", {}),
    "neuron-dra-ultraserver-operator": ("ultraserver-operator", {}),
    "neuron-dra-failure-detector": ("failure-detector", {}),
    # The stack's timings; Alertmanager's address is the stack's too, in the ConfigMap the
    # Deployment reads it from (see kustomization).
    ALERTS: (
        "alerts",
        {"NEURON_DRA_RESEND_SECONDS": "30", "NEURON_DRA_ALERT_TTL_SECONDS": "120"},
    ),
    # Its file is in the pod's own volume; every line goes to its log too (kubectl logs).
    "neuron-dra-audit": ("audit", {}),
}
DEPLOYMENTS: Final = tuple(SERVICES)
#: The stack's processes the Deployments take the place of.
SERVICE_KINDS: Final = frozenset(container for container, _ in SERVICES.values())
INSTANCE_TYPE: Final = "trn2.48xlarge"
#: Where the base mounts each service's bus token and NATS's CA.
BUS_MOUNT: Final = "/var/run/secrets/neuron-dra/bus"
#: The Secret the bus-auth component reads NATS's certificate and its CA from.
NATS_TLS_SECRET: Final = "neuron-dra-nats-tls"
#: Linux's "local/experimental use" character major (Documentation/admin-guide/devices.txt):
#: no driver serves it, so opening a simulated device fails (ENXIO) as a Neuron device node
#: would without the Neuron driver, while runc can still create it in a container.
DEVICE_MAJOR: Final = 240


def hardware_root(layout: Layout, node: str) -> Path:
    """A real node's simulated hardware: in its folder, so ``dev down`` removes it."""
    return realnodes.node_paths(layout, node).base / "hw"


def write_hardware(layout: Layout, node: str) -> SimNode:
    """Write a trn2.48xlarge's hardware for real node ``node``, its ``/dev/neuron<N>`` made
    character devices: runc injects a CDI device node only if its host path is a device
    node (it copies type and numbers from it), and the simulated files are regular ones."""
    sim = write_node(hardware_root(layout, node), instance_type=INSTANCE_TYPE, node_name=node)
    paths = HardwarePaths(sim.root)
    index = 0
    while paths.dev_node(index).exists():
        dev = paths.dev_node(index)
        dev.unlink()
        os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(DEVICE_MAJOR, index))
        dev.chmod(0o666)
        index += 1
    return sim


@dataclass(frozen=True)
class NodeSetup:
    """What the DaemonSets' patches need of the stack and its one real node: a DaemonSet
    has one pod spec, and each real node keeps its paths (kubelet root, CDI folder,
    hardware) in a folder of its own, so the driver runs on one real node."""

    image: str  # the product's image as imported (``localhost/neuron-dra:<tag>``)
    nats_url: str
    apiserver_port: int
    kubelet_root: Path  # as the kubelet was started with it (the short alias)
    cdi_dir: Path
    hardware: Path
    plugin_state: Path
    kubelet_healthz_port: int
    discovery_port: int
    plugin_port: int
    #: Deployment -> the host port of its HTTP server (see :func:`free_service_ports`).
    service_ports: Mapping[str, int]
    probe_port: int
    probe_state: Path  # the health probe's state folder on the node
    alertmanager_url: str
    #: The authenticated bus (the base's); False: ``--insecure-bus``, the open one.
    bus_auth: bool = True


def _env(pairs: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"name": k, "value": v} for k, v in pairs.items()]


def _host(path: Path) -> dict[str, str]:
    return {"path": str(path.resolve())}


def workload_patch(kind: str, name: str, pod: Mapping[str, Any], **spec: Any) -> str:
    """A strategic-merge patch (JSON) of workload ``kind``/``name``: ``pod`` merged into its
    pod template's spec, ``spec`` into its own."""
    return json.dumps(
        {
            "apiVersion": "apps/v1",
            "kind": kind,
            "metadata": {"name": name},
            "spec": {**spec, "template": {"spec": dict(pod)}},
        }
    )


def _daemonset(name: str, spec: dict[str, Any]) -> str:
    return workload_patch("DaemonSet", name, spec)


def _deployment(name: str, setup: NodeSetup, common: Mapping[str, Any]) -> str:
    """The patch of service ``name``'s Deployment: on the real node's network, at its free
    port, the apiserver at its loopback address. One replica: on the host's network a second
    one on the same node would find its port taken."""
    container, extra = SERVICES[name]
    env = {
        "NEURON_DRA_NATS_SERVERS": setup.nats_url,
        "NEURON_DRA_HTTP_PORT": str(setup.service_ports[name]),
        **extra,
        # No kube-proxy on the stack: the apiserver's own address.
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(setup.apiserver_port),
    }
    spec = {**common, "containers": [{"name": container, "env": _env(env)}]}
    return workload_patch("Deployment", name, spec, replicas=1)


def _port(port: int) -> str:
    """A JSON patch of the container's one port (a strategic merge would add a second)."""
    return json.dumps(
        [{"op": "replace", "path": "/spec/template/spec/containers/0/ports/0/containerPort",
          "value": port}]
    )  # fmt: skip


def kustomization(setup: NodeSetup, *, folder: Path, overlay: Path = LOCAL_OVERLAY) -> str:
    """The stack's kustomization (JSON, which is YAML) in ``folder``: ``overlay`` with the
    patches of this machine."""
    hw = setup.hardware
    common: dict[str, Any] = {
        # Only the real nodes: a simulated node has its agent processes already.
        "nodeSelector": {realconfig.REAL_NODE_LABEL: "true"},
        # NATS and the apiserver listen on the host's loopback only.
        "hostNetwork": True,
        "dnsPolicy": "ClusterFirstWithHostNet",
    }
    hardware_volumes = [
        {"name": "sys", "hostPath": _host(hw / "sys")},
        {"name": "dev", "hostPath": _host(hw / "dev")},
        {"name": "neuron", "hostPath": _host(hw / "opt" / "aws" / "neuron")},
    ]
    discovery = _daemonset(
        DISCOVERY,
        {
            **common,
            "containers": [
                {
                    "name": "discovery",
                    "env": _env(
                        {
                            "NEURON_DRA_NATS_SERVERS": setup.nats_url,
                            "NEURON_DRA_KUBELET_HEALTHZ_URL": (
                                f"http://127.0.0.1:{setup.kubelet_healthz_port}/healthz"
                            ),
                            "NEURON_DRA_HTTP_PORT": str(setup.discovery_port),
                        }
                    ),
                }
            ],
            "volumes": hardware_volumes,
        },
    )
    root = setup.kubelet_root
    plugin = _daemonset(
        PLUGIN,
        {
            **common,
            "containers": [
                {
                    "name": "kubelet-plugin",
                    "env": [
                        # Sockets without the pod's UID in their names: the kubelet's root is
                        # a folder of the stack's, and dra-<uid>.sock under it would pass the
                        # 107 bytes a socket path may have. The stack never rolls the
                        # DaemonSet, so no two plugin pods share the node.
                        {"name": "NEURON_DRA_POD_UID", "value": "", "valueFrom": None},
                        *_env(
                            {
                                "NEURON_DRA_NATS_SERVERS": setup.nats_url,
                                "NEURON_DRA_HTTP_PORT": str(setup.plugin_port),
                                # The endpoints it registers are paths of the kubelet's root.
                                "NEURON_DRA_KUBELET_ROOT": str(root),
                                "NEURON_DRA_DEV_ROOT": str((hw / "dev").resolve()),
                                # No kube-proxy on the stack: the apiserver's own address.
                                "KUBERNETES_SERVICE_HOST": "127.0.0.1",
                                "KUBERNETES_SERVICE_PORT": str(setup.apiserver_port),
                            }
                        ),
                    ],
                    # The same volumes at the kubelet's own paths as well (the socket paths
                    # the plugin registers must be right inside the container and on the host).
                    "volumeMounts": [
                        {"name": "plugins", "mountPath": str(root / "plugins")},
                        {"name": "registry", "mountPath": str(root / "plugins_registry")},
                    ],
                }
            ],
            "volumes": [
                {"name": "plugins", "hostPath": _host(root / "plugins")},
                {"name": "registry", "hostPath": _host(root / "plugins_registry")},
                {"name": "cdi", "hostPath": _host(setup.cdi_dir)},
                {"name": "state", "hostPath": _host(setup.plugin_state)},
                *hardware_volumes,
            ],
        },
    )
    probe = _daemonset(
        HEALTH_PROBE,
        {
            **common,
            "containers": [
                {
                    "name": "health-probe",
                    "env": _env(
                        {
                            "NEURON_DRA_NATS_SERVERS": setup.nats_url,
                            "NEURON_DRA_HTTP_PORT": str(setup.probe_port),
                            # The simulated driver's kernel log is a file of the hardware's.
                            "NEURON_DRA_KERNEL_LOG": "/host/var/log/kern.log",
                            # As the stack's probes: a fault shows within a second.
                            "NEURON_DRA_POLL_SECONDS": "1",
                            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
                            "KUBERNETES_SERVICE_PORT": str(setup.apiserver_port),
                        }
                    ),
                    "volumeMounts": [
                        {"name": "kernel-log", "mountPath": "/host/var/log", "readOnly": True}
                    ],
                }
            ],
            "volumes": [
                *hardware_volumes[:2],
                {"name": "state", "hostPath": {**_host(setup.probe_state),
                                               "type": "DirectoryOrCreate"}},
                {"name": "kernel-log", "hostPath": _host(hw / "var" / "log")},
            ],
        },
    )  # fmt: skip
    doc: dict[str, Any] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        # kustomize takes a base only by a relative path.
        "resources": [os.path.relpath(overlay.resolve(), folder.resolve())],
        # The overlay names the release's tag; the image imported is this checkout's.
        "images": [{"name": name, "newTag": tag} for name, tag in [setup.image.rsplit(":", 1)]],
        "patches": [
            {"target": {"kind": "DaemonSet", "name": DISCOVERY}, "patch": discovery},
            {"target": {"kind": "DaemonSet", "name": DISCOVERY}, "patch": _port(setup.discovery_port)},
            {"target": {"kind": "DaemonSet", "name": PLUGIN}, "patch": plugin},
            {"target": {"kind": "DaemonSet", "name": PLUGIN}, "patch": _port(setup.plugin_port)},
            {"target": {"kind": "ConfigMap", "name": ALERTS}, "patch": json.dumps(
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": ALERTS},
                 "data": {"alertmanager-url": setup.alertmanager_url}})},
            {"target": {"kind": "DaemonSet", "name": HEALTH_PROBE}, "patch": probe},
            {"target": {"kind": "DaemonSet", "name": HEALTH_PROBE}, "patch": _port(setup.probe_port)},
            *(
                {"target": {"kind": "Deployment", "name": name}, "patch": patch}
                for name in DEPLOYMENTS
                for patch in (_deployment(name, setup, common),
                              _port(setup.service_ports[name]))
            ),
        ],
    }  # fmt: skip
    if not setup.bus_auth:
        # The base gives each its projected bus token and NATS's CA; the open bus has neither.
        workloads = [
            ("DaemonSet", DISCOVERY, "discovery"),
            ("DaemonSet", PLUGIN, "kubelet-plugin"),
            ("DaemonSet", HEALTH_PROBE, "health-probe"),
            *(("Deployment", name, container) for name, (container, _) in SERVICES.items()),
        ]
        doc["patches"] += [
            {"target": {"kind": kind, "name": name}, "patch": _open_bus(kind, name, container)}
            for kind, name, container in workloads
        ]
    return json.dumps(doc, indent=2) + "\n"


def _open_bus(kind: str, name: str, container: str) -> str:
    """``--insecure-bus``: workload ``name`` without the bus token and CA the base mounts,
    told that the bus is open (``NEURON_DRA_INSECURE_BUS``)."""
    return workload_patch(
        kind,
        name,
        {
            "containers": [
                {
                    "name": container,
                    "env": [
                        {"name": "NEURON_DRA_NATS_TOKEN_FILE", "$patch": "delete"},
                        {"name": "NEURON_DRA_NATS_TLS_CA", "$patch": "delete"},
                        {"name": "NEURON_DRA_INSECURE_BUS", "value": "1"},
                    ],
                    "volumeMounts": [{"mountPath": BUS_MOUNT, "$patch": "delete"}],
                }
            ],
            "volumes": [{"name": "bus-token", "$patch": "delete"}],
        },
    )


def _wanted(obj: dict[str, Any]) -> bool:
    """The DaemonSets, the Deployments of :data:`DEPLOYMENTS`, their ServiceAccounts and the
    alerts subscriber's ConfigMap; the rest of the overlay (NATS, the other services, RBAC)
    runs as the stack's processes, is applied already, or is applied by ``realnats``."""
    name = obj.get("metadata", {}).get("name")
    kind = obj.get("kind")
    return (
        (kind in ("DaemonSet", "ServiceAccount") and name in DAEMONSETS)
        or (kind in ("Deployment", "ServiceAccount") and name in DEPLOYMENTS)
        # Where the alerts subscriber reads Alertmanager's address.
        or (kind == "ConfigMap" and name == ALERTS)
    )


def nats_tls_secret(pki: Pki) -> dict[str, Any]:
    """The Secret ``neuron-dra-nats-tls`` as cert-manager writes it (``kubernetes.io/tls``
    with ``ca.crt``), from the stack's PKI: NATS's certificate (it names 127.0.0.1, where
    the pods on the host's network dial it) and the CA every client checks it against."""
    cert = pki.nats()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": NATS_TLS_SECRET, "namespace": NAMESPACE},
        "stringData": {
            "ca.crt": pki.ca.cert.read_text(),
            "tls.crt": cert.cert.read_text(),
            "tls.key": cert.key.read_text(),
        },
    }


def render(kubeconfig: Path, folder: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize folder``, cut down to :func:`_wanted`."""
    out = kubectl.run(kubeconfig, ["kustomize", str(folder)]).stdout
    return [d for d in yaml.safe_load_all(out) if d and _wanted(d)]


def import_product_image(
    *, image: str, binaries: ContainerdBinaries, layout: Layout, nodes: Sequence[str]
) -> None:
    """The product's image into each real node's containerd (they pull nothing)."""
    with tempfile.TemporaryDirectory(prefix="ndra-image-") as tmp:
        archive = Path(tmp) / "image.oci.tar"
        imagebuild.podman("save", "--format", "oci-archive", "--output", str(archive), image)
        for node in nodes:
            realnodes.import_archive(binaries, realnodes.node_paths(layout, node), archive)


def apply(
    *,
    layout: Layout,
    kubeconfig: Path,
    setup: NodeSetup,
    nodes: Sequence[str],
    pki: Pki,
    timeout: float = 180.0,
) -> None:
    """Write the stack's kustomization, apply its DaemonSets and Deployments (on the
    authenticated bus with the Secret their projected volumes read), and wait until each has
    a Ready pod on every real node."""
    folder = layout.root / "real-node-driver"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kustomization.yaml").write_text(kustomization(setup, folder=folder))
    objects = render(kubeconfig, folder)
    found = sorted(o["metadata"]["name"] for o in objects if o["kind"] in _WORKLOADS)
    if found != sorted(DAEMONSETS + DEPLOYMENTS):
        raise CliError(
            f"{LOCAL_OVERLAY}: expected DaemonSets {DAEMONSETS} and Deployments "
            f"{DEPLOYMENTS}, rendered {found}"
        )
    if setup.bus_auth:
        # Before the pods: the kubelet does not start a container whose volume lacks it.
        objects.insert(0, nats_tls_secret(pki))
    kubectl.run(
        kubeconfig, ["apply", "-f", "-"], input=json.dumps({"kind": "List", "apiVersion": "v1",
                                                           "items": objects})
    )  # fmt: skip
    wait_ready(kubeconfig, workloads=DAEMONSETS + DEPLOYMENTS, nodes=nodes, timeout=timeout)


_WORKLOADS = ("DaemonSet", "Deployment")


def wait_ready(
    kubeconfig: Path, *, workloads: Sequence[str], nodes: Sequence[str], timeout: float
) -> None:
    """Wait until each of ``workloads`` (DaemonSets or Deployments in the driver's
    namespace) has a Ready pod on every one of ``nodes``; else :class:`CliError` naming
    those that have none."""
    deadline = time.monotonic() + timeout
    while True:
        missing = _not_ready(kubeconfig, workloads, nodes)
        if not missing:
            return
        if time.monotonic() > deadline:
            raise CliError(
                f"pods not Ready on the real nodes within {timeout:.0f} s: "
                + ", ".join(missing)
                + f" (kubectl -n {NAMESPACE} describe pods)"
            )
        time.sleep(1.0)


def _not_ready(kubeconfig: Path, workloads: Sequence[str], nodes: Sequence[str]) -> list[str]:
    proc = kubectl.run(kubeconfig, ["get", "pods", "-n", NAMESPACE, "-o", "json"], check=False)
    ready: set[tuple[str, str]] = set()
    if proc.returncode == 0:
        for pod in json.loads(proc.stdout).get("items", []):
            app = pod["metadata"].get("labels", {}).get("app.kubernetes.io/name", "")
            conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
            if conditions.get("Ready") == "True":
                ready.add((app, pod["spec"].get("nodeName", "")))
    return [f"{w} on {n}" for w in workloads for n in nodes if (w, n) not in ready]


def free_ports() -> tuple[int, int, int]:
    """Free host ports for discovery's, the plugin's and the health probe's HTTP servers
    (host network)."""
    return process.free_port(), process.free_port(), process.free_port()


def free_service_ports() -> dict[str, int]:
    """A free host port for the HTTP server of each of :data:`DEPLOYMENTS`."""
    return {name: process.free_port() for name in DEPLOYMENTS}
