"""Pods with one claim of their own, pinned to a node, as tests need them."""

from __future__ import annotations

from typing import Any


def claim_pod(
    name: str,
    *,
    node: str,
    count: int = 1,
    parameters: dict[str, Any] | None = None,
    namespace: str = "default",
) -> list[dict[str, Any]]:
    """A ResourceClaimTemplate for ``count`` Neuron devices (with an opaque config when
    ``parameters`` is given) and a pod on ``node`` using it."""
    request: dict[str, Any] = {
        "name": "neurons",
        "exactly": {"deviceClassName": "neuron.aws.com", "count": count},
    }
    devices: dict[str, Any] = {"requests": [request]}
    if parameters is not None:
        devices["config"] = [
            {
                "requests": ["neurons"],
                "opaque": {"driver": "neuron.aws.com", "parameters": parameters},
            }
        ]
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": devices}},
    }
    return [template, claim_user(name, node=node, template=name, namespace=namespace)]


def claim_user(
    name: str, *, node: str, claim: str = "", template: str = "", namespace: str = "default"
) -> dict[str, Any]:
    """A pod on ``node`` whose container uses the ResourceClaim ``claim``, or one made from
    the ResourceClaimTemplate ``template``."""
    source = {"resourceClaimName": claim} if claim else {"resourceClaimTemplateName": template}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {"name": "c", "image": "busybox", "resources": {"claims": [{"name": "neurons"}]}}
            ],
            "resourceClaims": [{"name": "neurons", **source}],
        },
    }
