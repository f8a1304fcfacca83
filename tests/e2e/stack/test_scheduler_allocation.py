"""The real kube-scheduler allocates connected Neuron devices from a hand-written
ResourceSlice when a user applies the 1x4 template of AWS's Neuron DRA driver guide verbatim
(v1beta1)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.stack import REPO, KubeStack, start_stack, stop_stack

pytestmark = pytest.mark.stack
MANIFESTS = Path(__file__).parent / "manifests"
# A namespace of its own: other tests in the session apply the same guide template.
NS = "guide-hand-slice"
DEVICE_CLASS = (
    Path(__file__).parents[3] / "deploy" / "kustomize" / "base" / "core" / "deviceclass.yaml"
)


def hand_written_slice(node: str) -> str:
    """16 trn2 devices in one pool; devicegroup4_id is the torus row (as in the real driver,
    one value per row of four)."""
    devices = [
        {
            "name": f"neurondevice{i}",
            "attributes": {
                "deviceId": {"int": i},
                "instanceType": {"string": "trn2.48xlarge"},
                "resourceType": {"string": "neuron_device"},
                "resource.aws.com/devicegroup4_id": {"string": f"row-{i // 4}"},
            },
        }
        for i in range(16)
    ]
    return json.dumps(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-neuron.aws.com"},
            "spec": {
                "driver": "neuron.aws.com",
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": devices,
            },
        }
    )


def allocated_devices(stack: KubeStack, pod: str) -> tuple[str, list[str]]:
    claims = stack.get_json("resourceclaims", "-n", NS)["items"]
    mine = [
        c
        for c in claims
        if any(o.get("name") == pod for o in c["metadata"].get("ownerReferences", []))
    ]
    assert len(mine) == 1, (
        f"expected one claim for {pod}, found {[c['metadata']['name'] for c in mine]}"
    )
    results: list[dict[str, Any]] = (
        mine[0].get("status", {}).get("allocation", {}).get("devices", {}).get("results", [])
    )
    return mine[0]["metadata"]["name"], sorted(r["device"] for r in results)


@pytest.fixture(scope="module")
def bare_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeStack]:
    """A stack whose only node is unmanaged, so the hand-written slice is the only one."""
    state_dir = tmp_path_factory.mktemp("bare-stack")
    stack = start_stack(state_dir, fleet=REPO / "tests" / "fleets" / "bare.yaml")
    try:
        yield stack
    finally:
        stop_stack(state_dir)


def test_guide_1x4_template_gets_one_connected_row(bare_stack: KubeStack) -> None:
    kube_stack = bare_stack
    node = "bare-trn2-0"
    kube_stack.create_namespace(NS)
    kube_stack.kubectl("apply", "-f", str(DEVICE_CLASS))
    kube_stack.kubectl("apply", "-f", "-", input=hand_written_slice(node))
    # Another workload first takes neurondevice0, so the first four free devices (1-4)
    # are *not* connected: only the matchAttribute constraint leads the scheduler to row 1.
    single = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "one-device", "namespace": NS},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "n", "exactly": {"deviceClassName": "neuron.aws.com", "count": 1}}
                ]
            }
        },
    }
    holder = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "holder", "namespace": NS},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [
                {"name": "c", "image": "busybox", "resources": {"claims": [{"name": "n"}]}}
            ],
            "resourceClaims": [{"name": "n", "resourceClaimName": "one-device"}],
        },
    }
    kube_stack.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [single, holder]}),
    )
    kube_stack.wait_for(
        "one-device to be allocated",
        lambda: (
            kube_stack.get_json("resourceclaim", "one-device", "-n", NS)
            .get("status", {})
            .get("allocation")
        ),
    )
    first = kube_stack.get_json("resourceclaim", "one-device", "-n", NS)
    assert [r["device"] for r in first["status"]["allocation"]["devices"]["results"]] == [
        "neurondevice0"
    ]

    applied = kube_stack.kubectl("apply", "-n", NS, "-f", str(MANIFESTS / "aws-dra-guide-1x4.yaml"))
    assert "resourceclaimtemplate.resource.k8s.io/1x4-connected-neurons created" in applied.stdout

    pod = kube_stack.wait_for(
        "pod0 to be bound to a node",
        lambda: (p := kube_stack.get_json("pod", "pod0", "-n", NS))["spec"].get("nodeName") and p,
    )
    assert pod["spec"]["nodeName"] == node
    claim, devices = allocated_devices(kube_stack, "pod0")
    assert devices == ["neurondevice4", "neurondevice5", "neurondevice6", "neurondevice7"], claim
    listing = kube_stack.kubectl("get", "resourceclaim", claim, "-n", NS).stdout
    assert "allocated" in listing
