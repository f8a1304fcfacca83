"""What a user sees of a node's device health, read with kubectl on the local stack."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from tests.fixtures.stack import KubeStack, neuron_dra
from tests.fixtures.subscribers import active_alerts


def fault(stack: KubeStack, node: str, kind: str, *, device: int | None = None) -> str:
    args = ["dev", "fault", node, kind, "--state-dir", str(stack.state_dir)]
    if device is not None:
        args += ["--device", str(device)]
    proc = neuron_dra(*args, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def device_taints(stack: KubeStack, node: str) -> dict[str, list[dict[str, Any]]]:
    """Device name -> its taints, in the newest generation of ``node``'s pool."""
    items = [
        s
        for s in stack.get_json("resourceslices")["items"]
        if s["spec"].get("pool", {}).get("name") == node
    ]
    if not items:
        return {}
    top = max(s["spec"]["pool"]["generation"] for s in items)
    return {
        d["name"]: d.get("taints") or []
        for s in items
        if s["spec"]["pool"]["generation"] == top
        for d in s["spec"].get("devices") or []
    }


def condition(stack: KubeStack, node: str, kind: str) -> dict[str, Any]:
    conditions = stack.get_json("node", node)["status"].get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), {})


#: The key of the taint a device's hardware error puts on it.
HARDWARE_ERROR = "neuron.aws.com/hardware-error"


def taints(stack: KubeStack, node: str, device: str) -> set[tuple[str, str, str]]:
    """(key, value, effect) of each taint on ``device`` of ``node``'s pool."""
    return {(t["key"], t["value"], t["effect"]) for t in device_taints(stack, node).get(device, [])}


def neuron_health(stack: KubeStack, node: str) -> tuple[str, str]:
    """Status and reason of the Node's ``NeuronHealth`` condition."""
    found = condition(stack, node, "NeuronHealth")
    return str(found.get("status", "")), str(found.get("reason", ""))


def node_events(stack: KubeStack, node: str, reason: str) -> list[dict[str, Any]]:
    """The Events with ``reason`` on Node ``node`` (the failure detector writes them in
    ``default``)."""
    items: list[dict[str, Any]] = stack.get_json(
        "events",
        "-n",
        "default",
        "--field-selector",
        f"involvedObject.kind=Node,involvedObject.name={node},reason={reason}",
    )["items"]
    return items


def alerts(stack: KubeStack, **labels: str) -> list[dict[str, Any]]:
    """The active alerts the stack's Alertmanager shows (its v2 API), by labels."""
    state = json.loads((stack.state_dir / "state.json").read_text())
    (port,) = [c["ports"]["web"] for c in state["components"] if c["name"] == "alertmanager"]
    return active_alerts(f"http://127.0.0.1:{port}", **labels)


def topology(stack: KubeStack, node: str) -> str:
    proc = neuron_dra("topology", "show", node, "--kubeconfig", str(stack.kubeconfig), timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def timed_wait(
    stack: KubeStack, what: str, check: Callable[[], Any], *, timeout: float = 60
) -> float:
    """Wait as :meth:`KubeStack.wait_for` does, polling fast; return the seconds it took."""
    start = time.monotonic()
    deadline = start + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return time.monotonic() - start
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


def resources_status(stack: KubeStack, pod: str) -> list[dict[str, Any]]:
    """The pod's ``allocatedResourcesStatus`` entries, flattened."""
    obj = json.loads(stack.kubectl("get", "pod", pod, "-o", "json").stdout)
    out: list[dict[str, Any]] = []
    for status in obj.get("status", {}).get("containerStatuses") or []:
        for entry in status.get("allocatedResourcesStatus") or []:
            out += entry.get("resources") or []
    return out


def claim_and_pod(*, name: str, node: str, device: int) -> str:
    """A claim for one device of ``node`` (by deviceId) and a pod using it."""
    return f"""
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: {name}
spec:
  devices:
    requests:
    - name: neuron
      exactly:
        deviceClassName: neuron.aws.com
        selectors:
        - cel:
            expression: "device.attributes['neuron.aws.com'].deviceId == {device}"
---
apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  nodeSelector:
    kubernetes.io/hostname: {node}
  terminationGracePeriodSeconds: 1
  containers:
  - name: ctr0
    image: public.ecr.aws/ubuntu/ubuntu:22.04
    command: ["sleep", "9999"]
    resources:
      claims:
      - name: neuron
  resourceClaims:
  - name: neuron
    resourceClaimName: {name}
"""
