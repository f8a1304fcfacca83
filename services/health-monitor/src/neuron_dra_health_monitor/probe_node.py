"""The node's health conditions on its Node object (``NeuronHealth``,
``AcceleratedHardwareReady``), written by the probe of that node.

A strategic merge patch of ``nodes/<name>/status`` merges conditions by type, so the
kubelet's own conditions (and any other agent's) are left alone; the probe needs only
``patch`` on ``nodes/status`` (see ``deploy/kustomize/base/health-probe``).
``lastTransitionTime`` moves only when a condition's status changes.

``NeuronHealth`` has a second writer, the kubelet plugin, which sets it ``True`` with a reason
of its own on a kubelet it warns about (``KubeletDRARegression``). The probe owns the reasons
``NeuronHasNoError`` and ``NeuronHasError_<TYPE>``: with no device error to report it leaves a
``True`` condition of another reason as it is, rather than clear someone else's problem (a
device error, more urgent, is written over it).
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


def _another_problem(condition: dict[str, Any]) -> bool:
    """A ``True`` NeuronHealth whose reason is not one of the probe's."""
    reason = str(condition.get("reason", ""))
    ours = reason == "NeuronHasNoError" or reason.startswith("NeuronHasError_")
    return condition.get("status") == "True" and not ours


class ConditionWriter:
    """Writes the conditions it is given when they differ from what it last wrote."""

    def __init__(self, client: KubeClient, *, node: str, types: frozenset[str]) -> None:
        self._client = client
        self._node = node
        self._types = types
        self._written: Conditions | None = None

    async def _current(self) -> dict[str, dict[str, Any]]:
        obj = await self._client.get(NODES, self._node)
        return {c.get("type", ""): c for c in (obj.get("status") or {}).get("conditions") or []}

    async def write(self, conditions: Conditions, *, now: datetime) -> bool:
        """Patch the Node if ``conditions`` changed; ``True`` once they are on the Node."""
        wanted = {t: v for t, v in conditions.items() if t in self._types}
        if wanted == self._written:
            return True
        current = await self._current()
        items: list[dict[str, Any]] = []
        for kind, (status, reason, message) in sorted(wanted.items()):
            there = current.get(kind, {})
            if kind == "NeuronHealth" and status == "False" and _another_problem(there):
                continue  # another writer's problem (the kubelet plugin's) stands
            item: dict[str, Any] = {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": _stamp(now),
            }
            if there.get("status") != status:
                item["lastTransitionTime"] = _stamp(now)
            items.append(item)
        if items:
            await self._client.patch_status(
                NODES, self._node, {"status": {"conditions": items}}, kind="strategic"
            )
        self._written = wanted
        log.info(
            "node conditions written",
            extra={"node": self._node, "conditions": {k: v[:2] for k, v in wanted.items()}},
        )
        return True
