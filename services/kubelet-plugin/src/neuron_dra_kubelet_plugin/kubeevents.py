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
from collections.abc import Mapping
from typing import Any, Final, Protocol

from neuron_dra_kubelet_plugin.claims import ResourceClaim

__all__ = ["REASON", "ClaimEventRecorder", "EventWriter"]

log = logging.getLogger(__name__)

REASON: Final = "FailedPrepare"
_COMPONENT: Final = "neuron-dra-kubelet-plugin"


class EventWriter(Protocol):
    """The API call used (``KubeClient.post_event`` has this shape)."""

    async def post_event(
        self,
        involved: Mapping[str, str],
        *,
        reason: str,
        message: str,
        component: str,
        warning: bool = False,
        host: str = "",
    ) -> Any: ...


class ClaimEventRecorder:
    """A :class:`~neuron_dra_kubelet_plugin.preparer.FailureReporter` that posts Events."""

    def __init__(self, writer: EventWriter, *, node: str, capacity: int = 1000) -> None:
        self._writer = writer
        self._node = node
        self._seen: set[tuple[str, str]] = set()
        self._queue: asyncio.Queue[tuple[dict[str, str], str] | None] = asyncio.Queue(
            maxsize=capacity
        )
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
            involved = {**target, "namespace": claim.metadata.namespace}
            self._queue.put_nowait((involved, message))

    def stop(self) -> None:
        if self._queue.full():
            self._queue.get_nowait()
        self._queue.put_nowait(None)

    async def run(self) -> None:
        while (event := await self._queue.get()) is not None:
            involved, message = event
            try:
                await self._writer.post_event(
                    involved,
                    reason=REASON,
                    message=message,
                    component=_COMPONENT,
                    warning=True,
                    host=self._node,
                )
                self.posted += 1
            except Exception as exc:  # an Event is a courtesy: never stop the plugin for it
                log.warning(
                    "event not recorded",
                    extra={"object": involved["name"], "error": repr(exc)},
                )
