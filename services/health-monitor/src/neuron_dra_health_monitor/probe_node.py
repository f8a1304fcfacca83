"""The node's health conditions on its Node object (``NeuronHealth``,
``AcceleratedHardwareReady``), written by the probe of that node.

A strategic merge patch of ``nodes/<name>/status`` merges conditions by type, so the
kubelet's own conditions (and any other agent's) are left alone; the probe needs only
``patch`` on ``nodes/status`` (see ``deploy/kustomize/base/health-probe``).
``lastTransitionTime`` moves only when a condition's status changes.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from neuron_dra_common.kube import NODES, KubeClient

__all__ = ["ConditionWriter"]

log = logging.getLogger(__name__)

Conditions = dict[str, tuple[str, str, str]]


def _stamp(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ConditionWriter:
    """Writes the conditions it is given when they differ from what it last wrote."""

    def __init__(self, client: KubeClient, *, node: str, types: frozenset[str]) -> None:
        self._client = client
        self._node = node
        self._types = types
        self._written: Conditions | None = None
        self._statuses: dict[str, str] | None = None

    async def _current_statuses(self) -> dict[str, str]:
        obj = await self._client.get(NODES, self._node)
        return {
            c.get("type", ""): c.get("status", "")
            for c in (obj.get("status") or {}).get("conditions") or []
        }

    async def write(self, conditions: Conditions, *, now: datetime) -> bool:
        """Patch the Node if ``conditions`` changed; ``True`` once they are on the Node."""
        wanted = {t: v for t, v in conditions.items() if t in self._types}
        if wanted == self._written:
            return True
        if self._statuses is None:
            self._statuses = await self._current_statuses()
        items: list[dict[str, Any]] = []
        for kind, (status, reason, message) in sorted(wanted.items()):
            item: dict[str, Any] = {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": _stamp(now),
            }
            if self._statuses.get(kind) != status:
                item["lastTransitionTime"] = _stamp(now)
            items.append(item)
        await self._client.patch_status(
            NODES, self._node, {"status": {"conditions": items}}, kind="strategic"
        )
        self._statuses.update({k: v[0] for k, v in wanted.items()})
        self._written = wanted
        log.info(
            "node conditions written",
            extra={"node": self._node, "conditions": {k: v[:2] for k, v in wanted.items()}},
        )
        return True
