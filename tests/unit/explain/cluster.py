"""A small cluster as API objects: pools straight from the slice publisher's ``build_pool``,
the product's DeviceClass, and claims/pods written as a user writes them."""

from __future__ import annotations

from typing import Any

from neuron_dra_common.explain import Snapshot
from neuron_dra_common.hardware.model import NeuronDevice, NodeHardware
from neuron_dra_slice_publisher.pool import NodeRef, render_slice
from neuron_dra_slice_publisher.slices import NodeDeviceMode, build_pool

NEURON_CLASS: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "neuron.aws.com"},
    "spec": {"selectors": [{"cel": {"expression": "device.driver == 'neuron.aws.com'"}}]},
}
DEVICES = {"trn2.48xlarge": 16, "inf2.48xlarge": 12, "trn2u.48xlarge": 16}


def slices(
    node: str,
    instance_type: str = "trn2.48xlarge",
    *,
    mode: NodeDeviceMode = NodeDeviceMode.COUNTERS,
    taints: dict[str, list[dict[str, str]]] | None = None,
    labels: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    hardware = NodeHardware(
        instance_type=instance_type,
        driver_version="2.24.7.0",
        devices=tuple(NeuronDevice(index=i) for i in range(DEVICES[instance_type])),
    )
    pool = build_pool(
        node=node,
        hardware=hardware,
        labels=labels or {},
        mode=mode,
        dra_driver_version="0.1.0",
        taints=taints,
    )
    owner = NodeRef(name=node, uid=f"uid-{node}")
    return [
        render_slice(content, owner=owner, index=i, generation=1, count=len(pool.slices))
        for i, content in enumerate(pool.slices)
    ]


def node(name: str, instance_type: str = "trn2.48xlarge", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "node.kubernetes.io/instance-type": instance_type,
            },
        },
        "spec": spec,
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def claim(
    name: str,
    *requests: dict[str, Any],
    constraints: list[dict[str, Any]] | None = None,
    allocated_on: str = "",
    devices: list[str] | None = None,
    namespace: str = "default",
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": list(requests)}},
    }
    if constraints:
        obj["spec"]["devices"]["constraints"] = constraints
    if allocated_on:
        obj["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": requests[0]["name"] if requests else "r",
                            "driver": "neuron.aws.com",
                            "pool": allocated_on,
                            "device": device,
                        }
                        for device in devices or ()
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [allocated_on]}
                            ]
                        }
                    ]
                },
            }
        }
    return obj


def request(name: str = "neurons", count: int = 1, *selectors: str, **extra: Any) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "neuron.aws.com", **extra}
    if extra.get("allocationMode") != "All":
        exactly["count"] = count
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    return {"name": name, "exactly": exactly}


def pod(name: str, *claims: str, namespace: str = "default", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
        "spec": {
            "containers": [{"name": "main", "image": "busybox"}],
            "resourceClaims": [{"name": c, "resourceClaimName": c} for c in claims],
            **spec,
        },
    }


def snapshot(
    nodes: dict[str, str],
    *objects: dict[str, Any],
    extra_slices: list[dict[str, Any]] | None = None,
    **node_spec: Any,
) -> Snapshot:
    """``nodes``: name -> instance type; ``objects``: claims and pods (told by their spec)."""
    pods = [o for o in objects if "containers" in o.get("spec", {})]
    claims = [o for o in objects if "devices" in o.get("spec", {})]
    all_slices = [s for name, kind in nodes.items() for s in slices(name, kind)]
    return Snapshot.build(
        pods=pods,
        nodes=[node(name, kind, **node_spec) for name, kind in nodes.items()],
        slices=all_slices + (extra_slices or []),
        claims=claims,
        classes=[NEURON_CLASS],
    )
