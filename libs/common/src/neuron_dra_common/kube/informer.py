"""A small informer: list, then watch from the list's version, feeding a cache.

Bookmarks keep the resume point fresh; a 410 Gone (the version was compacted away) makes it
list again, and the differences are applied to the same cache and reported as events, so no
change is missed; any other error backs off and resumes the watch from the last version seen.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, Final, Literal

from neuron_dra_common.kube.client import (
    UNANSWERED,
    ApiException,
    KubeClient,
    Resource,
    object_key,
)

__all__ = ["EventType", "Informer", "Transform"]

log = logging.getLogger(__name__)

Obj = dict[str, Any]
EventType = Literal["ADDED", "MODIFIED", "DELETED"]
Listener = Callable[[EventType, Obj], Awaitable[None] | None]
Transform = Callable[[Obj], Obj]

_BACKOFF: Final = (0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


class _Gone(Exception):
    pass


class Informer:
    """Keeps :attr:`cache` (``namespace/name`` -> object) equal to the apiserver's view.

    The cache is one dict for the informer's whole life, updated in place (after a relist
    too), so a reference to it is always current. Listeners are called for each change right
    after the cache took it: when a listener runs, the cache holds exactly what it was told
    (an ``ADDED``/``MODIFIED`` object is in it, a ``DELETED`` one is not). A level-triggered
    controller only enqueues the key there and reads the cache in its reconcile.

    >>> informer = Informer(client, RESOURCE_SLICES)
    >>> informer.add_listener(lambda kind, obj: queue.add(object_key(obj)))
    >>> task = asyncio.create_task(informer.run(), name="slices-informer")
    >>> await informer.wait_synced()
    """

    def __init__(
        self,
        client: KubeClient,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
        watch_timeout: int = 300,
        transform: Transform | None = None,
        metadata_only: bool = False,
    ) -> None:
        """``transform`` trims each object before it is cached and handed to listeners (keep
        what the controller reads; a cache of large objects costs memory and GC time).
        ``metadata_only`` lists and watches ``PartialObjectMetadata``: the server never
        serializes, nor the client decodes, what the controller would drop anyway (and the
        client does not build the objects' ``managedFields``). ``field_selector``
        (``spec.nodeName=``) narrows the list and the watch as the API does."""
        self.resource = resource
        self.cache: dict[str, Obj] = {}
        self.resource_version = ""
        self.relists = 0
        self._client = client
        self._namespace = namespace
        self._selector = label_selector
        self._fields = field_selector
        self._watch_timeout = watch_timeout
        self._transform = transform
        self._metadata_only = metadata_only
        self._listeners: list[Listener] = []
        self._synced = asyncio.Event()
        self._stop = False
        self._stopped = asyncio.Event()

    @property
    def synced(self) -> bool:
        """True once the first list filled the cache."""
        return self._synced.is_set()

    async def wait_synced(self) -> None:
        await self._synced.wait()

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def stop(self) -> None:
        """Make :meth:`run` return now (a watch in progress is closed)."""
        self._stop = True
        self._stopped.set()

    async def _emit(self, kind: EventType, obj: Obj) -> None:
        for listener in self._listeners:
            result = listener(kind, obj)
            if result is not None:
                await result

    async def _relist(self) -> None:
        """List and bring the cache to the list's state in place, reporting each difference.

        What went away is removed (and reported) first, so a controller that reacts to an
        addition already sees the room the removals made. An object deleted and created again
        under the same name meanwhile (another UID) is reported as deleted, then added.
        """
        items, version = await self._client.list(
            self.resource,
            namespace=self._namespace,
            label_selector=self._selector,
            field_selector=self._fields,
            metadata_only=self._metadata_only,
        )
        if self._transform is not None:
            items = [self._transform(obj) for obj in items]
        fresh = {object_key(obj): obj for obj in items}
        self.resource_version = version
        for key in [k for k in self.cache if k not in fresh]:
            await self._emit("DELETED", self.cache.pop(key))
        for key, obj in fresh.items():
            before = self.cache.get(key)
            if before is not None and _uid(before) != _uid(obj):
                del self.cache[key]
                await self._emit("DELETED", before)
                before = None
            if before is None:
                self.cache[key] = obj
                await self._emit("ADDED", obj)
            elif _version(before) != _version(obj):
                self.cache[key] = obj
                await self._emit("MODIFIED", obj)
        self._synced.set()

    async def _watch(self) -> None:
        events = self._client.watch(
            self.resource,
            resource_version=self.resource_version,
            namespace=self._namespace,
            label_selector=self._selector,
            field_selector=self._fields,
            timeout_seconds=self._watch_timeout,
            metadata_only=self._metadata_only,
        )
        # Closed here, on return, error or cancellation alike: the watch's connection goes
        # back at once, not whenever the abandoned generator is collected.
        async with contextlib.aclosing(events):
            await self._follow(events)

    async def _follow(self, events: AsyncGenerator[Obj, None]) -> None:
        async for event in events:
            kind = event.get("type")
            obj: Obj = event.get("object") or {}
            if kind == "ERROR":
                if obj.get("code") == 410:
                    raise _Gone(obj.get("message", "resource version too old"))
                raise ApiException(status=obj.get("code", 0), reason=obj.get("message", ""))
            version = _version(obj)
            if version:
                self.resource_version = version
            if kind == "BOOKMARK":
                continue
            if self._transform is not None:
                obj = self._transform(obj)
            key = object_key(obj)
            if kind == "DELETED":
                self.cache.pop(key, None)
                await self._emit("DELETED", obj)
            elif kind in ("ADDED", "MODIFIED"):
                self.cache[key] = obj
                await self._emit(kind, obj)
            if self._stop:
                return

    async def run(self) -> None:
        """List, then watch for ever (until :meth:`stop`), recovering from every error."""
        failures = 0
        need_list = True
        while not self._stop:
            try:
                if need_list:
                    await self._relist()
                    need_list = False
                if not await self._watch_until_stopped():
                    return
                failures = 0
            except _Gone as exc:
                log.info(
                    "watch expired, listing again",
                    extra={"resource": self.resource.plural, "reason": str(exc)},
                )
                self.relists += 1
                need_list = True
            except ApiException as exc:
                if exc.status == 410:
                    self.relists += 1
                    need_list = True
                    continue
                failures += 1
                await self._pause(failures, exc)
            except (*UNANSWERED, ValueError) as exc:
                # Connection reset, apiserver restarting, a stream cut mid-body, a truncated
                # line: resume later from the last version seen.
                failures += 1
                await self._pause(failures, exc)

    async def _watch_until_stopped(self) -> bool:
        """One watch, cut short by :meth:`stop`; False when stopped."""
        watch = asyncio.ensure_future(self._watch())
        stopped = asyncio.ensure_future(self._stopped.wait())
        try:
            await asyncio.wait({watch, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if not watch.done():
                watch.cancel()
                await asyncio.gather(watch, return_exceptions=True)
        if watch.cancelled():
            return False
        watch.result()  # raises what the watch raised
        return True

    async def _pause(self, failures: int, exc: Exception) -> None:
        delay = _BACKOFF[min(failures - 1, len(_BACKOFF) - 1)]
        log.warning(
            "informer error, retrying",
            extra={"resource": self.resource.plural, "retry_in": delay, "error": repr(exc)},
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopped.wait(), timeout=delay)


def _version(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def _uid(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")
