"""The extender's Kubernetes side: Node and Pod caches, and the binding that annotates the pod.

Both caches are informers trimmed to what the extender reads. The pod watch feeds the ledger:
at start its first list rebuilds who holds what from the pods' annotations, and the service is
ready only after it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import msgspec
from neuron_dra_common.extended import ANNOTATION_IDS, ANNOTATION_NODE, ANNOTATION_RESOURCE
from neuron_dra_common.kube import NODES, PODS, EventType, Informer, KubeClient

from neuron_dra_scheduler_extender.api import NodeView, PodView
from neuron_dra_scheduler_extender.extender import Extender, decode_pod
from neuron_dra_scheduler_extender.inputs import INSTANCE_TYPE_LABELS, MANAGED_RESOURCES

__all__ = ["PODS", "KubeCluster"]

Obj = dict[str, Any]


_POD_ANNOTATIONS: Final = (ANNOTATION_IDS, ANNOTATION_RESOURCE, ANNOTATION_NODE)


def _identity(meta: Obj) -> Obj:
    # Kept so that a relist (after the watch's history expired) tells what changed while the
    # watch was down: the informer compares resource versions and uids, and a trimmed object
    # without them would look unchanged.
    return {"uid": meta.get("uid", ""), "resourceVersion": meta.get("resourceVersion", "")}


def _trim_node(obj: Obj) -> Obj:
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    status = obj.get("status") or {}

    def neuron(values: Obj | None) -> Obj:
        return {k: v for k, v in (values or {}).items() if k in MANAGED_RESOURCES}

    return {
        "metadata": {
            "name": meta.get("name", ""),
            **_identity(meta),
            "labels": {k: labels[k] for k in INSTANCE_TYPE_LABELS if k in labels},
        },
        "status": {
            "capacity": neuron(status.get("capacity")),
            "allocatable": neuron(status.get("allocatable")),
        },
    }


def _trim_resources(containers: list[Obj] | None) -> list[Obj]:
    out = []
    for c in containers or []:
        res = c.get("resources") or {}
        out.append(
            {
                "name": c.get("name", ""),
                "resources": {
                    kind: {k: v for k, v in (res.get(kind) or {}).items() if k in MANAGED_RESOURCES}
                    for kind in ("limits", "requests")
                },
            }
        )
    return out


def _trim_pod(obj: Obj) -> Obj:
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    spec = obj.get("spec") or {}
    return {
        "metadata": {
            "name": meta.get("name", ""),
            "namespace": meta.get("namespace", ""),
            **_identity(meta),
            "annotations": {k: annotations[k] for k in _POD_ANNOTATIONS if k in annotations},
        },
        "spec": {
            "nodeName": spec.get("nodeName", ""),
            "containers": _trim_resources(spec.get("containers")),
            "initContainers": _trim_resources(spec.get("initContainers")),
        },
        "status": {"phase": (obj.get("status") or {}).get("phase", "")},
    }


class KubeCluster:
    """:class:`~neuron_dra_scheduler_extender.extender.Cluster` over the API server."""

    def __init__(self, client: KubeClient) -> None:
        self._client = client
        self.nodes = Informer(client, NODES, transform=_trim_node)
        self.pods = Informer(client, PODS, transform=_trim_pod)
        self._node_views: dict[str, NodeView] = {}

    def follow(self, extender: Extender) -> None:
        """Feed ``extender``'s ledger from the pod watch."""

        def on_pod(kind: EventType, obj: Obj) -> None:
            extender.observe(decode_pod(obj), deleted=kind == "DELETED")

        def on_node(kind: EventType, obj: Obj) -> None:
            name = str((obj.get("metadata") or {}).get("name", ""))
            if kind == "DELETED":
                self._node_views.pop(name, None)
            else:
                self._node_views[name] = msgspec.convert(obj, NodeView)

        self.pods.add_listener(on_pod)
        self.nodes.add_listener(on_node)

    @property
    def synced(self) -> bool:
        return self.nodes.synced and self.pods.synced

    def node_views(self) -> Mapping[str, NodeView]:
        return self._node_views

    def known_pod(self, namespace: str, name: str) -> PodView | None:
        obj = self.pods.cache.get(f"{namespace}/{name}")
        return None if obj is None else decode_pod(obj)

    async def get_pod(self, namespace: str, name: str) -> PodView:
        obj = await self._client.get(PODS, name, namespace=namespace)
        return decode_pod(_trim_pod(obj))

    async def bind(
        self, namespace: str, name: str, *, uid: str, node: str, annotations: dict[str, str]
    ) -> None:
        # The API server merges a Binding's annotations into the pod as it sets the node, in
        # the same update (kubernetes/kubernetes#5005); the uid is a precondition: a pod
        # deleted and made again under the same name is refused, not bound.
        await self._client.create(
            PODS,
            {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "uid": uid,
                    "annotations": annotations,
                },
                "target": {"apiVersion": "v1", "kind": "Node", "name": node},
            },
            namespace=namespace,
            name=name,
            subresource="binding",
        )
