"""What the failure detector shows on the cluster: Events on Nodes and the taint that holds a
flapping node unschedulable."""

from __future__ import annotations

import logging
from typing import Any, Final

from neuron_dra_common.kube import NODES, ApiException, KubeClient

__all__ = ["COMPONENT", "FLAPPING_TAINT", "NodeNotes", "tainted"]

log = logging.getLogger(__name__)

COMPONENT: Final = "neuron-dra-failure-detector"
#: Held on a node that keeps getting lost until it stays up (NoSchedule: running pods stay).
FLAPPING_TAINT: Final = "neuron.aws.com/unstable"
_ATTEMPTS: Final = 5

Obj = dict[str, Any]


def tainted(node: Obj) -> bool:
    """Whether ``node`` carries the flapping taint."""
    taints = (node.get("spec") or {}).get("taints") or ()
    return any(t.get("key") == FLAPPING_TAINT for t in taints)


class NodeNotes:
    """Writes what a person looks at: Events on the Node, the flapping taint."""

    def __init__(self, client: KubeClient) -> None:
        self._client = client

    async def held_nodes(self) -> list[str]:
        """The nodes carrying the flapping taint now (held before a restart)."""
        nodes, _ = await self._client.list(NODES)
        return sorted(str(n["metadata"]["name"]) for n in nodes if tainted(n))

    async def hold(self, node: str, *, reason: str) -> None:
        if await self._set_taint(node, present=True, reason=reason):
            await self.event(node, reason="NodeFlapping", message=reason, warning=True)

    async def release(self, node: str, *, reason: str) -> None:
        if await self._set_taint(node, present=False, reason=reason):
            await self.event(node, reason="NodeStable", message=reason, warning=False)

    async def _set_taint(self, node: str, *, present: bool, reason: str) -> bool:
        """Add or remove the taint (read, change, write with the resourceVersion, again on
        a conflict); True when the Node changed."""
        for _ in range(_ATTEMPTS):
            try:
                obj = await self._client.get(NODES, node)
            except ApiException as exc:
                if exc.status == 404:
                    return False
                raise
            taints = [
                t for t in (obj.get("spec") or {}).get("taints") or () if t["key"] != FLAPPING_TAINT
            ]
            if present == tainted(obj):
                return False
            if present:
                taints.append({"key": FLAPPING_TAINT, "value": "flapping", "effect": "NoSchedule"})
            body = {
                "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
                "spec": {"taints": taints},
            }
            try:
                await self._client.patch(NODES, node, body)
            except ApiException as exc:
                if exc.status == 409:
                    continue
                raise
            return True
        log.warning("taint not written after conflicts", extra={"node": node, "reason": reason})
        return False

    async def event(self, node: str, *, reason: str, message: str, warning: bool) -> None:
        """An Event on the Node (lost: it is for people; never stalls the detector)."""
        try:
            await self._client.post_event(
                {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
                reason=reason,
                message=message,
                component=COMPONENT,
                warning=warning,
            )
        except (ApiException, ValueError, OSError, TimeoutError) as exc:
            log.warning("event not recorded", extra={"node": node, "error": str(exc)})
