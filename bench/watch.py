"""Seeing a change when it happens: a Kubernetes watch and a bus follower that resolve
waiters with the time an event reached this process (what a user's watch would see).

A waiter is registered *before* the change it waits for is made (:meth:`Watched.expect`
is not a coroutine, so nothing can slip in between), and resolves with the arrival time of
the first event after which its test holds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from neuron_dra_common.bus import Bus, Follower
from neuron_dra_common.events import AnyEvent
from neuron_dra_common.kube import KubeClient, Resource

__all__ = ["BusEvents", "Watched", "wait"]

Obj = dict[str, Any]
#: A test over every object of the resource, by ``namespace/name``.
StateTest = Callable[[dict[str, Obj]], bool]


class _Waiter:
    def __init__(self, what: str, test: Callable[[Any], bool]) -> None:
        self.what = what
        self.test = test
        self.future: asyncio.Future[float] = asyncio.get_running_loop().create_future()


async def wait(future: asyncio.Future[float], *, what: str, within: float) -> float:
    """The time ``future`` resolved with; fails naming ``what`` after ``within`` seconds."""
    try:
        return await asyncio.wait_for(asyncio.shield(future), within)
    except TimeoutError:
        future.cancel()
        raise RuntimeError(f"not seen within {within:.0f} s: {what}") from None


class Watched:
    """The objects of one resource, kept current by a list and a watch (relisting when the
    watch ends or expires)."""

    def __init__(self, kube: KubeClient, resource: Resource, *, namespace: str | None = None):
        self._kube = kube
        self._resource = resource
        self._namespace = namespace
        self.objects: dict[str, Obj] = {}
        self.started = asyncio.Event()
        self._waiters: list[_Waiter] = []

    def expect(self, what: str, test: StateTest) -> asyncio.Future[float]:
        """A future of the time ``test`` first holds over the objects (now, if it does)."""
        waiter = _Waiter(what, test)
        if test(self.objects):
            waiter.future.set_result(time.perf_counter())
        else:
            self._waiters.append(waiter)
        return waiter.future

    def _changed(self, at: float) -> None:
        left = []
        for waiter in self._waiters:
            if waiter.future.done():
                continue
            if waiter.test(self.objects):
                waiter.future.set_result(at)
            else:
                left.append(waiter)
        self._waiters = left

    async def _relist(self) -> str:
        items, version = await self._kube.list(self._resource, namespace=self._namespace)
        self.objects = {_key(o): o for o in items}
        self._changed(time.perf_counter())
        return version

    async def run(self) -> None:
        version = await self._relist()
        self.started.set()
        while True:
            expired = False
            async for event in self._kube.watch(
                self._resource, resource_version=version, namespace=self._namespace
            ):
                at = time.perf_counter()
                kind, obj = str(event.get("type")), event.get("object") or {}
                if kind == "ERROR":
                    expired = True
                    break
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                if kind == "BOOKMARK":
                    continue
                if kind == "DELETED":
                    self.objects.pop(_key(obj), None)
                else:
                    self.objects[_key(obj)] = obj
                self._changed(at)
            if expired:
                version = await self._relist()


class BusEvents:
    """Every event of the ``NEURON_HEALTH`` stream as it arrives, for waiters."""

    def __init__(self, bus: Bus, *, stream: str, subject: str) -> None:
        self._waiters: list[_Waiter] = []
        self.follower = Follower(
            bus, name="bench-recovery", stream=stream, subject=subject, handler=self._saw
        )

    def expect(self, what: str, test: Callable[[AnyEvent], bool]) -> asyncio.Future[float]:
        """A future of the arrival time of the first event from now on that passes ``test``."""
        waiter = _Waiter(what, test)
        self._waiters.append(waiter)
        return waiter.future

    def _saw(self, event: AnyEvent) -> None:
        at = time.perf_counter()
        left = []
        for waiter in self._waiters:
            if waiter.future.done():
                continue
            if waiter.test(event):
                waiter.future.set_result(at)
            else:
                left.append(waiter)
        self._waiters = left


def _key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"
