"""Where pools are stored: the API (ResourceSlices) behind a small protocol, so the controller
also runs against an in-memory store in tests."""

from __future__ import annotations

import asyncio
import copy
import logging
from typing import Any, Literal, Protocol

from neuron_dra_common.kube import JSON, PROTOBUF, RESOURCE_SLICES, ApiException, KubeClient

from neuron_dra_slice_publisher.encoding import Unencodable, encode_slice
from neuron_dra_slice_publisher.pool import MANAGED_BY, NODE_LABEL, label_value

__all__ = ["Conflict", "KubeSliceStore", "MemorySliceStore", "SliceStore"]

log = logging.getLogger(__name__)

Obj = dict[str, Any]
Encoding = Literal["protobuf", "json"]
SELECTOR = f"app.kubernetes.io/managed-by={MANAGED_BY}"


class Conflict(Exception):
    """The stored slice moved on since it was read: read again, then plan again."""


class SliceStore(Protocol):
    """Creates and replaces return the stored slice: at least its metadata (name,
    resourceVersion, ownerReferences, annotations), which :func:`stored_slice` reads."""

    async def create(self, body: Obj) -> Obj: ...
    async def replace(self, name: str, body: Obj, *, resource_version: str) -> Obj: ...
    async def delete(self, name: str) -> None: ...
    async def list_node(self, node: str) -> list[Obj]: ...
    async def list_all(self) -> list[Obj]: ...


class KubeSliceStore:
    """ResourceSlices in the API; 409 becomes :class:`Conflict`, 404 on delete is done.

    Creates and replaces are answered with the slice's metadata only (``PartialObjectMetadata``,
    without field managers): the publisher reads back name, resourceVersion, owner and its
    annotations, never the devices it just sent.

    ``encoding="protobuf"`` (the default) sends request bodies in Kubernetes' protobuf
    encoding (see :mod:`neuron_dra_slice_publisher.encoding`), which the apiserver decodes
    for a fraction of the JSON's cost; a slice with a field the protobuf messages do not
    cover goes as JSON. ``"json"`` always sends JSON.
    """

    def __init__(self, client: KubeClient, *, encoding: Encoding = "protobuf") -> None:
        self._client = client
        self.encoding = encoding

    def _body(self, obj: Obj) -> tuple[Obj | bytes, str]:
        if self.encoding == "protobuf":
            try:
                return encode_slice(obj), PROTOBUF
            except Unencodable as exc:
                log.warning(
                    "slice written as JSON",
                    extra={"slice": obj.get("metadata", {}).get("name"), "error": str(exc)},
                )
        return obj, JSON

    async def create(self, body: Obj) -> Obj:
        data, content_type = self._body(body)
        try:
            return await self._client.create(
                RESOURCE_SLICES, data, content_type=content_type, metadata_only=True
            )
        except ApiException as exc:
            if exc.status == 409:
                raise Conflict(f"ResourceSlice {body['metadata']['name']}: exists") from exc
            raise

    async def replace(self, name: str, body: Obj, *, resource_version: str) -> Obj:
        # Shallow: only the metadata differs from the planned body, which stays as it was.
        obj = {**body, "metadata": {**body["metadata"], "resourceVersion": resource_version}}
        data, content_type = self._body(obj)
        try:
            return await self._client.replace(
                RESOURCE_SLICES, name, data, content_type=content_type, metadata_only=True
            )
        except ApiException as exc:
            if exc.status in (404, 409):
                raise Conflict(f"ResourceSlice {name}: changed or gone ({exc.status})") from exc
            raise

    async def delete(self, name: str) -> None:
        try:
            await self._client.delete(RESOURCE_SLICES, name)
        except ApiException as exc:
            if exc.status != 404:
                raise

    async def list_node(self, node: str) -> list[Obj]:
        selector = f"{SELECTOR},{NODE_LABEL}={label_value(node)}"
        items, _ = await self._client.list(RESOURCE_SLICES, label_selector=selector)
        return items

    async def list_all(self) -> list[Obj]:
        items, _ = await self._client.list(RESOURCE_SLICES, label_selector=SELECTOR)
        return items


class MemorySliceStore:
    """The same contract in memory; ``writes`` counts creates and replaces per slice name."""

    def __init__(self) -> None:
        self.objects: dict[str, Obj] = {}
        self.writes: dict[str, int] = {}
        self._version = 0
        self.fail_next: list[Exception] = []

    def _stamp(self, body: Obj) -> Obj:
        self._version += 1
        obj = copy.deepcopy(body)
        obj["metadata"]["resourceVersion"] = str(self._version)
        name = obj["metadata"]["name"]
        self.objects[name] = obj
        self.writes[name] = self.writes.get(name, 0) + 1
        return copy.deepcopy(obj)

    def _maybe_fail(self) -> None:
        if self.fail_next:
            raise self.fail_next.pop(0)

    async def create(self, body: Obj) -> Obj:
        await asyncio.sleep(0)
        self._maybe_fail()
        if body["metadata"]["name"] in self.objects:
            raise Conflict(f"ResourceSlice {body['metadata']['name']}: exists")
        return self._stamp(body)

    async def replace(self, name: str, body: Obj, *, resource_version: str) -> Obj:
        await asyncio.sleep(0)
        self._maybe_fail()
        current = self.objects.get(name)
        if current is None or current["metadata"]["resourceVersion"] != resource_version:
            raise Conflict(f"ResourceSlice {name}: changed or gone")
        return self._stamp(body)

    async def delete(self, name: str) -> None:
        await asyncio.sleep(0)
        self._maybe_fail()
        self.objects.pop(name, None)

    async def list_node(self, node: str) -> list[Obj]:
        return [
            copy.deepcopy(o)
            for o in self.objects.values()
            if o["metadata"]["labels"].get(NODE_LABEL) == label_value(node)
        ]

    async def list_all(self) -> list[Obj]:
        return [copy.deepcopy(o) for o in self.objects.values()]
