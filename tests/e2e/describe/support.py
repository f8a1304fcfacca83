"""Pods, claims and what the scheduler gave them, read the way a user reads them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.fixtures.stack import REPO, KubeStack

EXAMPLES = REPO / "examples" / "aws-dra-guide"
VERSIONS = ("v1beta1", "v1")


def example(version: str, name: str) -> Path:
    return EXAMPLES / version / name


def pod(name: str, template: str, *, node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [
            {"name": "c", "image": "busybox", "resources": {"claims": [{"name": "neurons"}]}}
        ],
        "resourceClaims": [{"name": "neurons", "resourceClaimTemplateName": template}],
    }
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def create(stack: KubeStack, ns: str, *objs: dict[str, Any]) -> None:
    body = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objs)})
    stack.kubectl("apply", "-n", ns, "-f", "-", input=body)


def bound(stack: KubeStack, ns: str, name: str, *, timeout: float = 60) -> str:
    """The node the scheduler bound pod ``name`` to."""
    node: str = stack.wait_for(
        f"pod {ns}/{name} bound",
        lambda: stack.get_json("pod", name, "-n", ns)["spec"].get("nodeName"),
        timeout=timeout,
    )
    return node


def allocation(stack: KubeStack, ns: str, pod_name: str) -> tuple[set[str], list[str]]:
    """The pools and the sorted device names allocated to the claim of ``pod_name``."""
    claims = stack.get_json("resourceclaims", "-n", ns)["items"]
    mine = [
        c
        for c in claims
        if any(o.get("name") == pod_name for o in c["metadata"].get("ownerReferences", []))
    ]
    assert len(mine) == 1, (
        f"one claim expected for {pod_name}: {[c['metadata']['name'] for c in mine]}"
    )
    results = mine[0]["status"]["allocation"]["devices"]["results"]
    devices = sorted((r["device"] for r in results), key=lambda d: (len(d), d))
    return {r["pool"] for r in results}, devices


def unschedulable_reason(stack: KubeStack, ns: str, name: str) -> str:
    """The scheduler's message once it gave up on the pod for now."""

    def reason() -> str:
        conds = stack.get_json("pod", name, "-n", ns).get("status", {}).get("conditions", [])
        for c in conds:
            if c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable":
                return str(c.get("message", ""))
        return ""

    message: str = stack.wait_for(f"pod {ns}/{name} unschedulable", reason, timeout=60)
    return message


def chips(*ids: int) -> list[str]:
    return [f"neurondevice{i}" for i in ids]
