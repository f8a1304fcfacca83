"""The driver's own DaemonSets on a real node (``dev up --real-nodes 1 --real-node-driver``).

Discovery, the kubelet plugin and the cluster services (slice publisher, topology allocator,
UltraServer operator, failure detector) run there as real containers from deploy/kustomize's
local overlay (the stack starts no process of those services then); the publisher's
Deployment, with its own ServiceAccount's token and the manifests' RBAC, turns discovery's
inventory into the node's ResourceSlice, and a pod claiming four connected devices
runs as a real container with the devices the real kubelet had our plugin prepare and
containerd inject.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from neuron_dra_cli.stack import realdriver

from tests.e2e.actuate.support import ranges
from tests.e2e.health.support import HARDWARE_ERROR, alerts, fault, neuron_health, taints
from tests.e2e.realnode.conftest import REAL_NODE
from tests.fixtures.stack import KubeStack

NAMESPACE = "neuron-dra-driver"
CLAIMS = "real-node-claims"


def _driver_pods(stack: KubeStack) -> dict[str, list[tuple[str, str]]]:
    """DaemonSet or Deployment name -> (node, phase) of each of its pods."""
    found: dict[str, list[tuple[str, str]]] = {}
    for pod in stack.get_json("pods", "-n", NAMESPACE)["items"]:
        app = pod["metadata"].get("labels", {}).get("app.kubernetes.io/name", "")
        if app in realdriver.DAEMONSETS + realdriver.DEPLOYMENTS:
            found.setdefault(app, []).append(
                (pod["spec"].get("nodeName", ""), pod["status"].get("phase", ""))
            )
    return found


def _processes(stack: KubeStack) -> set[str]:
    """The kinds of the processes the stack started (``dev up``'s state)."""
    state = json.loads((stack.state_dir / "state.json").read_text())
    return {c["kind"] for c in state["components"]}


def driver_runs_on_the_real_node_only(stack: KubeStack) -> None:
    """Each DaemonSet and each cluster service's Deployment have one pod, Running on the
    real node, of this checkout's image; the stack runs no process of those services, and
    each one that leads holds its Lease as that pod."""
    pods = _driver_pods(stack)
    assert pods == {
        "neuron-dra-discovery": [(REAL_NODE, "Running")],
        "neuron-dra-kubelet-plugin": [(REAL_NODE, "Running")],
        "neuron-dra-health-probe": [(REAL_NODE, "Running")],
        "neuron-dra-slice-publisher": [(REAL_NODE, "Running")],
        "neuron-dra-topology-allocator": [(REAL_NODE, "Running")],
        "neuron-dra-ultraserver-operator": [(REAL_NODE, "Running")],
        "neuron-dra-failure-detector": [(REAL_NODE, "Running")],
        "neuron-dra-alerts": [(REAL_NODE, "Running")],
        "neuron-dra-audit": [(REAL_NODE, "Running")],
    }
    for kind, names in (
        ("daemonset", realdriver.DAEMONSETS),
        ("deployment", realdriver.DEPLOYMENTS),
    ):
        for name in names:
            obj = stack.get_json(kind, name, "-n", NAMESPACE)
            image = obj["spec"]["template"]["spec"]["containers"][0]["image"]
            assert image.startswith("localhost/neuron-dra:0.1.0"), image
            assert obj["status"]["numberReady" if kind == "daemonset" else "readyReplicas"] == 1
    kinds = _processes(stack)
    assert not kinds & realdriver.SERVICE_KINDS
    assert "kube-apiserver" in kinds  # the state is read right: the stack's own processes
    stack.wait_for(
        "the Leases held by the services' pods",
        lambda: _lease_holders(stack) >= {_pod_of(stack, name) for name in LEADERS},
        timeout=60,
    )


#: The services that lead through a Lease (the allocator runs one replica, no Lease).
LEADERS = (realdriver.PUBLISHER, "neuron-dra-ultraserver-operator", "neuron-dra-failure-detector")


def _pod_of(stack: KubeStack, app: str) -> str:
    [pod] = [
        p["metadata"]["name"]
        for p in stack.get_json("pods", "-n", NAMESPACE)["items"]
        if p["metadata"].get("labels", {}).get("app.kubernetes.io/name") == app
    ]
    return str(pod)


def _lease_holders(stack: KubeStack) -> set[str]:
    return {
        str(lease["spec"].get("holderIdentity"))
        for lease in stack.get_json("leases", "-n", NAMESPACE)["items"]
    }


def test_the_driver_daemonsets_run_on_the_real_node_only(real_stack: KubeStack) -> None:
    driver_runs_on_the_real_node_only(real_stack)


def test_nats_is_the_bases_statefulset_on_the_real_node(real_stack: KubeStack) -> None:
    stack = real_stack
    pod = stack.get_json("pod", "nats-0", "-n", NAMESPACE)
    assert (pod["spec"]["nodeName"], pod["status"]["phase"]) == (REAL_NODE, "Running")
    [container] = pod["spec"]["containers"]
    assert container["image"].startswith("localhost/nats:"), container["image"]
    claim = stack.get_json("pvc", "data-nats-0", "-n", NAMESPACE)
    assert (claim["status"]["phase"], claim["spec"]["volumeName"]) == (
        "Bound",
        "neuron-dra-data-nats-0",
    )
    assert "nats" not in _processes(stack)
    # The server the stack's clients reach is that pod (its name is the base's server_name)
    # with the streams the services declared on its volume.
    monitor = next(p["containerPort"] for p in container["ports"] if p["name"] == "monitor")
    with urllib.request.urlopen(f"http://127.0.0.1:{monitor}/varz", timeout=10) as resp:
        varz = json.load(resp)
    assert varz["server_name"] == "nats-0"
    assert f":{varz['port']}" in stack.nats_url
    with urllib.request.urlopen(f"http://127.0.0.1:{monitor}/jsz", timeout=10) as resp:
        jsz = json.load(resp)
    assert jsz["config"]["store_dir"].startswith("/data")
    assert jsz["streams"] > 0


def _slice_devices(stack: KubeStack) -> list[str]:
    slices = stack.get_json("resourceslices", "--field-selector", f"spec.nodeName={REAL_NODE}")[
        "items"
    ]
    return sorted(d["name"] for s in slices for d in s["spec"].get("devices", []))


def real_slice_lists_its_16_devices(stack: KubeStack) -> None:
    """The real node's neuron.aws.com ResourceSlice, from discovery's inventory on the bus,
    written by the slice publisher's pod: the Lease it leads by names that pod."""
    devices = stack.wait_for(
        f"{REAL_NODE}'s ResourceSlice", lambda: _slice_devices(stack), timeout=60
    )
    assert devices == sorted(f"neurondevice{i}" for i in range(16))
    assert _pod_of(stack, realdriver.PUBLISHER) in _lease_holders(stack)


def test_the_real_nodes_resource_slice_lists_its_16_devices(real_stack: KubeStack) -> None:
    real_slice_lists_its_16_devices(real_stack)


def audit_log(stack: KubeStack) -> str:
    """``kubectl logs`` of the audit subscriber's pod: a CloudEvents JSON line per event."""
    proc = stack.kubectl("logs", "deployment/neuron-dra-audit", "-n", NAMESPACE, check=False)
    return str(proc.stdout) if proc.returncode == 0 else ""


def test_a_device_fault_on_the_real_node_shows_as_its_taint_condition_and_alert(
    real_stack: KubeStack,
) -> None:
    stack = real_stack
    device = "neurondevice5"

    real_slice_lists_its_16_devices(stack)
    fault(stack, REAL_NODE, "hbm-repairable", device=5)
    try:
        # The probe's pod read the counter; the publisher's pod wrote the taint.
        stack.wait_for(
            f"the NoSchedule taint on {REAL_NODE}/{device}",
            lambda: (
                taints(stack, REAL_NODE, device)
                == {(HARDWARE_ERROR, "HBM_REPAIRABLE_ERROR", "NoSchedule")}
            ),
            timeout=60,
        )
        stack.wait_for(
            "NeuronHealth NeuronHasError_HBM_REPAIRABLE_ERROR on the Node",
            lambda: (
                neuron_health(stack, REAL_NODE) == ("True", "NeuronHasError_HBM_REPAIRABLE_ERROR")
            ),
            timeout=60,
        )
        # The alerts pod told the stack's Alertmanager.
        [alert] = stack.wait_for(
            "NeuronDeviceUnhealthy in Alertmanager",
            lambda: alerts(stack, alertname="NeuronDeviceUnhealthy", node=REAL_NODE, device=device),
            timeout=60,
        )
        assert alert["labels"]["severity"] == "warning"
        # The audit pod wrote the health event to its log.
        stack.wait_for(
            "the health event in the audit pod's log",
            lambda: [
                line
                for line in audit_log(stack).splitlines()
                if REAL_NODE in line and "HBM_REPAIRABLE_ERROR" in line
            ],
            timeout=60,
        )
    finally:
        fault(stack, REAL_NODE, "repair")
    stack.wait_for(
        f"{device} without taints", lambda: not taints(stack, REAL_NODE, device), timeout=60
    )


def _connected_pod(name: str, *, image: str) -> list[dict[str, Any]]:
    """AWS's guide's 1x4 example (four connected devices of a trn2.48xlarge), on the real
    node, printing what the container got."""
    script = (
        "import glob, os, time\n"
        "print('devices', ' '.join(sorted(glob.glob('/dev/neuron*'))))\n"
        "print('cores', os.environ.get('NEURON_RT_VISIBLE_CORES', ''), flush=True)\n"
        "time.sleep(600)\n"
    )
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": CLAIMS},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "neurons",
                            "exactly": {
                                "deviceClassName": "neuron.aws.com",
                                "count": 4,
                                "selectors": [
                                    {
                                        "cel": {
                                            "expression": "device.attributes['neuron.aws.com']"
                                            ".instanceType == 'trn2.48xlarge'"
                                        }
                                    }
                                ],
                            },
                        }
                    ],
                    "constraints": [
                        {
                            "requests": ["neurons"],
                            "matchAttribute": "resource.aws.com/devicegroup4_id",
                        }
                    ],
                }
            }
        },
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": CLAIMS},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": REAL_NODE},
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["python3", "-c", script],
                    "resources": {"claims": [{"name": "neurons"}]},
                }
            ],
            "resourceClaims": [{"name": "neurons", "resourceClaimTemplateName": name}],
        },
    }
    return [template, pod]


def driver_image(stack: KubeStack) -> str:
    """The product's image as the real node's containerd has it (the plugin's)."""
    ds = stack.get_json("daemonset", realdriver.PLUGIN, "-n", NAMESPACE)
    return str(ds["spec"]["template"]["spec"]["containers"][0]["image"])


def test_a_pod_gets_its_four_connected_devices_in_a_real_container(
    real_stack: KubeStack,
) -> None:
    a_pod_gets_four_connected_devices(real_stack)


def a_pod_gets_four_connected_devices(stack: KubeStack) -> None:
    """A seed pod claiming four connected devices runs on the real node and prints exactly
    their device nodes and cores."""
    image = driver_image(stack)
    stack.create_namespace(CLAIMS)
    manifest = {"apiVersion": "v1", "kind": "List", "items": _connected_pod("pod0", image=image)}
    stack.kubectl("apply", "-f", "-", input=json.dumps(manifest))

    def phase() -> str:
        return str(stack.get_json("pod", "pod0", "-n", CLAIMS)["status"].get("phase", ""))

    stack.wait_for("pod0 Running", lambda: phase() == "Running", timeout=120)
    pod = stack.get_json("pod", "pod0", "-n", CLAIMS)
    assert pod["spec"]["nodeName"] == REAL_NODE
    claim_name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    claim = stack.get_json("resourceclaim", claim_name, "-n", CLAIMS)
    results = claim["status"]["allocation"]["devices"]["results"]
    indices = sorted(int(r["device"].removeprefix("neurondevice")) for r in results)
    assert len(indices) == 4
    assert indices[0] % 4 == 0
    assert indices == list(range(indices[0], indices[0] + 4))
    logs = stack.wait_for(
        "pod0's output",
        lambda: (
            stack.kubectl("logs", "pod0", "-n", CLAIMS).stdout.count("\n") >= 2
            and stack.kubectl("logs", "pod0", "-n", CLAIMS).stdout
        ),
        timeout=30,
    )
    # trn2 at the default LNC=2: device d owns logical cores 4d..4d+3.
    cores = ranges([4 * d + c for d in indices for c in range(4)])
    assert logs.splitlines() == [
        "devices " + " ".join(sorted(f"/dev/neuron{i}" for i in indices)),
        f"cores {cores}",
    ]
