"""Warning Events for claims that cannot be prepared, on the pods that wait for them.

The kubelet reports a failed prepare in its own way (and some kubelets only log it), so the
plugin also records what a user needs to fix, where ``kubectl describe pod`` shows it: a
Warning Event ``FailedPrepare`` on each pod the claim is reserved for (on the claim itself
when none is). One Event per claim and message for the life of the process: the kubelet
retries a failed claim every few seconds and the user needs to read the reason once, not a
thousand times. Posting happens in a task; a prepare never waits for the API.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any, Final, Protocol

from neuron_dra_kubelet_plugin.claims import ResourceClaim

__all__ = ["REASON", "ClaimEventRecorder", "EventWriter"]

log = logging.getLogger(__name__)

REASON: Final = "FailedPrepare"
_COMPONENT: Final = "neuron-dra-kubelet-plugin"
_MAX_MESSAGE: Final = 1024


class EventWriter(Protocol):
    """The API call used (``KubeClient.request`` has this shape)."""

    async def request(
        self, method: str, path: str, *, body: dict[str, Any] | None = None
    ) -> Any: ...


class ClaimEventRecorder:
    """A :class:`~neuron_dra_kubelet_plugin.preparer.FailureReporter` that posts Events."""

    def __init__(self, writer: EventWriter, *, node: str, capacity: int = 1000) -> None:
        self._writer = writer
        self._node = node
        self._seen: set[tuple[str, str]] = set()
        self._queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(maxsize=capacity)
        self.posted = 0

    def failed(self, claim: ResourceClaim, message: str) -> None:
        key = (claim.metadata.uid, message)
        if key in self._seen or self._queue.full():
            return
        self._seen.add(key)
        pods = [c for c in claim.status.reserved_for if c.resource in ("pods", "")]
        targets = [
            {"apiVersion": "v1", "kind": "Pod", "name": c.name, "uid": c.uid} for c in pods
        ] or [
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "name": claim.metadata.name,
                "uid": claim.metadata.uid,
            }
        ]
        for target in targets:
            self._queue.put_nowait(self._event(claim, target, message))

    def _event(self, claim: ResourceClaim, target: dict[str, str], message: str) -> dict[str, Any]:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        namespace = claim.metadata.namespace
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{target['name']}.", "namespace": namespace},
            "involvedObject": {**target, "namespace": namespace},
            "reason": REASON,
            "message": message[:_MAX_MESSAGE],
            "type": "Warning",
            "source": {"component": _COMPONENT, "host": self._node},
            "reportingComponent": _COMPONENT,
            "reportingInstance": self._node,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }

    def stop(self) -> None:
        if self._queue.full():
            self._queue.get_nowait()
        self._queue.put_nowait(None)

    async def run(self) -> None:
        while (event := await self._queue.get()) is not None:
            namespace = event["metadata"]["namespace"]
            try:
                await self._writer.request(
                    "POST", f"/api/v1/namespaces/{namespace}/events", body=event
                )
                self.posted += 1
            except Exception as exc:  # an Event is a courtesy: never stop the plugin for it
                log.warning(
                    "event not recorded",
                    extra={"object": event["involvedObject"]["name"], "error": repr(exc)},
                )
