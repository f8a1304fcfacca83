"""The scheduler extension's pod annotations, read from the API server and marked served.

On each Allocate the plugin lists the pods bound to its node (one GET with a field selector;
Allocate is rare and this keeps no watch open), picks the pod the call is for
(:func:`.pending.pick_pending`) and sets its ``NEURON_ALLOCATED`` to ``"true"``. The merge
patch carries the pod's ``resourceVersion``, so of two plugins racing for the same pod only
one serves it; the other sees the conflict and looks again.
"""

from __future__ import annotations

import asyncio
import logging

from neuron_dra_common.extended import ANNOTATION_ALLOCATED
from neuron_dra_common.kube import PODS, ApiException, KubeClient

from neuron_dra_device_plugin.pending import Pending, pick_pending

__all__ = ["ApiAnnotatedPods"]

log = logging.getLogger(__name__)

_CONFLICT = 409
_ATTEMPTS = 3


class ApiAnnotatedPods:
    """:class:`.servicer.AnnotatedPods` over the API server, for the pods of ``node``."""

    def __init__(self, client: KubeClient, *, node: str) -> None:
        self._client = client
        self._node = node
        # One Allocate at a time picks a pod, so two calls never take the same one.
        self._lock = asyncio.Lock()

    async def claim(self, *, resource: str, count: int) -> Pending | None:
        async with self._lock:
            for _ in range(_ATTEMPTS):
                items, _ = await self._client.list(
                    PODS, field_selector=f"spec.nodeName={self._node}"
                )
                pending = pick_pending(items, resource=resource, count=count)
                if pending is None:
                    return None
                version = next(
                    (
                        p["metadata"].get("resourceVersion", "")
                        for p in items
                        if p["metadata"].get("uid") == pending.uid
                    ),
                    "",
                )
                try:
                    await self._client.patch(
                        PODS,
                        pending.name,
                        {
                            "metadata": {
                                "resourceVersion": version,
                                "annotations": {ANNOTATION_ALLOCATED: "true"},
                            }
                        },
                        namespace=pending.namespace,
                    )
                except ApiException as exc:
                    if exc.status == _CONFLICT:
                        continue
                    raise
                return pending
            return None
