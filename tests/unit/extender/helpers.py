"""Nodes and pods as kube-scheduler sends them to an extender."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import msgspec
from neuron_dra_common.topology import instance_spec, logical_cores_per_device
from neuron_dra_scheduler_extender.api import NodeView, PodView
from neuron_dra_scheduler_extender.extender import decode_pod
from neuron_dra_scheduler_extender.inputs import NodeShape, shape_of


def node_obj(
    name: str, instance_type: str, *, cores_per_device: int | None = None
) -> dict[str, Any]:
    spec = instance_spec(instance_type)
    per = cores_per_device or logical_cores_per_device(spec)
    capacity = {
        "cpu": "192",
        "aws.amazon.com/neuron": str(spec.devices),
        "aws.amazon.com/neuroncore": str(spec.devices * per),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"node.kubernetes.io/instance-type": instance_type},
        },
        "status": {"capacity": capacity, "allocatable": capacity},
    }


def shape(instance_type: str, name: str = "n0") -> NodeShape:
    return shape_of(msgspec.convert(node_obj(name, instance_type), NodeView))


def pod_obj(
    name: str,
    *,
    resource: str = "aws.amazon.com/neuron",
    count: int | str = 1,
    uid: str = "",
    namespace: str = "default",
    annotations: dict[str, str] | None = None,
    node_name: str = "",
    phase: str = "Pending",
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or f"uid-{name}",
            "annotations": annotations or {},
        },
        "spec": {
            "nodeName": node_name,
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"limits": {resource: str(count), "cpu": "1"}},
                }
            ],
        },
        "status": {"phase": phase},
    }


def pod(name: str, **kwargs: Any) -> PodView:
    return msgspec.convert(pod_obj(name, **kwargs), PodView)


class FakeCluster:
    """Pods and nodes in memory; ``bind`` waits for ``gate`` so that binds can overlap."""

    def __init__(self, nodes: list[dict[str, Any]]) -> None:
        self.nodes = {n["metadata"]["name"]: msgspec.convert(n, NodeView) for n in nodes}
        self.pods: dict[str, dict[str, Any]] = {}
        self.bound: dict[str, str] = {}
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail_bind = False

    def add(self, obj: dict[str, Any]) -> PodView:
        self.pods[f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"] = obj
        return decode_pod(obj)

    def node_views(self) -> Mapping[str, NodeView]:
        return self.nodes

    def known_pod(self, namespace: str, name: str) -> PodView | None:
        obj = self.pods.get(f"{namespace}/{name}")
        return None if obj is None else decode_pod(obj)

    async def get_pod(self, namespace: str, name: str) -> PodView:
        return decode_pod(self.pods[f"{namespace}/{name}"])

    async def bind(
        self, namespace: str, name: str, *, uid: str, node: str, annotations: dict[str, str]
    ) -> None:
        await self.gate.wait()
        if self.fail_bind:
            raise RuntimeError("the apiserver refused the binding")
        obj = self.pods[f"{namespace}/{name}"]
        assert obj["metadata"]["uid"] == uid
        if obj["spec"]["nodeName"]:
            raise RuntimeError(f"pod {name} is already assigned to node {obj['spec']['nodeName']}")
        obj["metadata"]["annotations"].update(annotations)
        obj["spec"]["nodeName"] = node
        self.bound[f"{namespace}/{name}"] = node
