"""The operator's writes to the API: statuses, node records, finalizers, Events.

Every write is a server-side apply as one field manager (or a create that tolerates
"already exists"), so repeating it after a restart changes nothing.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from neuron_dra_common.kube import NODES, ApiException, KubeClient, apply, apply_status
from neuron_dra_common.ultraserver import NODE_ALLOCATION, NodeAllocation, encode_node_allocation

from neuron_dra_ultraserver_operator.model import EVENTS, FIELD_MANAGER, FINALIZER, NUSW, Workload

__all__ = ["Writer", "now"]

log = logging.getLogger(__name__)

Obj = dict[str, Any]


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Writer:
    def __init__(self, client: KubeClient) -> None:
        self.client = client
        self._last_event: dict[str, tuple[str, str]] = {}

    async def finalizer(self, workload: Workload, *, present: bool) -> None:
        meta: Obj = {"name": workload.metadata.name, "namespace": workload.metadata.namespace}
        if present:
            meta["finalizers"] = [FINALIZER]
        try:
            await apply(self.client, NUSW, {"metadata": meta}, field_manager=FIELD_MANAGER)
        except ApiException as exc:
            if exc.status == 404 and not present:
                return  # already gone
            raise

    async def status(self, workload: Workload, status: Obj) -> None:
        body = {
            "metadata": {"name": workload.metadata.name, "namespace": workload.metadata.namespace},
            "status": status,
        }
        try:
            await apply_status(self.client, NUSW, body, field_manager=FIELD_MANAGER)
        except ApiException as exc:
            if exc.status != 404:
                raise

    async def node_record(self, node: str, record: NodeAllocation | None) -> None:
        """Write (or with ``None`` remove) the allocation record on ``node``.

        A merge patch, not an apply: an apply to a Node that is gone would create an empty
        Node object, while a patch answers 404, and a node that is gone holds nothing.
        """
        value = encode_node_allocation(record) if record is not None else None
        try:
            await self.client.request(
                "PATCH",
                NODES.path(name=node),
                body={"metadata": {"annotations": {NODE_ALLOCATION: value}}},
                content_type="application/merge-patch+json",
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    async def event(
        self, workload: Workload, *, reason: str, message: str, warning: bool = False
    ) -> None:
        """Record an Event on the workload (once per distinct reason and message in a row)."""
        key = workload.metadata.uid
        if self._last_event.get(key) == (reason, message):
            return
        self._last_event[key] = (reason, message)
        stamp = now()
        body = {
            "metadata": {
                "generateName": f"{workload.metadata.name}.",
                "namespace": workload.metadata.namespace,
            },
            "involvedObject": {
                "apiVersion": NUSW.api_version,
                "kind": NUSW.kind,
                "name": workload.metadata.name,
                "namespace": workload.metadata.namespace,
                "uid": workload.metadata.uid,
            },
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": FIELD_MANAGER,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            await self.client.request(
                "POST", EVENTS.path(namespace=workload.metadata.namespace), body=body
            )
        except ApiException as exc:
            # An Event is for people; losing one must not stall the reconcile.
            log.warning("event not recorded", extra={"workload": workload.key, "error": str(exc)})

    def forget(self, uid: str) -> None:
        self._last_event.pop(uid, None)
