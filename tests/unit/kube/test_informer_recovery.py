"""Informer recovery paths that a healthy apiserver rarely shows on demand: 410 Gone and errors.

The same informer is tested against the real apiserver in tests/integration/kube.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from neuron_dra_common.kube import CONFIGMAPS, Informer


def cm(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}}


class ScriptedApi:
    """Answers list and watch calls from a script, one entry per call."""

    def __init__(self, lists: list[Any], watches: list[list[dict[str, Any]] | Exception]) -> None:
        self.lists, self.watches = lists, watches
        self.watched_from: list[str] = []

    async def list(self, resource: Any, **kw: Any) -> tuple[list[dict[str, Any]], str]:
        result = self.lists.pop(0)
        if isinstance(result, Exception):
            raise result
        return result  # type: ignore[no-any-return]

    async def watch(self, resource: Any, *, resource_version: str, **kw: Any) -> AsyncIterator[Any]:
        self.watched_from.append(resource_version)
        step = self.watches.pop(0) if self.watches else []
        if isinstance(step, Exception):
            raise step
        for event in step:
            yield event
        if not self.watches:
            await asyncio.sleep(3600)


async def test_gone_relists_and_reports_what_changed_meanwhile() -> None:
    api = ScriptedApi(
        lists=[([cm("a", "1"), cm("b", "1")], "10"), ([cm("a", "12"), cm("c", "13")], "13")],
        watches=[
            [{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "11"}}}],
            [{"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}}],
            [{"type": "ADDED", "object": cm("d", "14")}],
        ],
    )
    informer = Informer(api, CONFIGMAPS)  # type: ignore[arg-type]
    cache = informer.cache
    seen: list[tuple[str, str]] = []
    informer.add_listener(lambda kind, obj: seen.append((kind, obj["metadata"]["name"])))
    task = asyncio.create_task(informer.run())
    for _ in range(200):
        if ("ADDED", "d") in seen:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert api.watched_from == ["10", "11", "13"]  # bookmark moved the resume point
    assert informer.relists == 1
    assert seen == [
        ("ADDED", "a"),
        ("ADDED", "b"),
        ("DELETED", "b"),
        ("MODIFIED", "a"),
        ("ADDED", "c"),
        ("ADDED", "d"),
    ]
    assert informer.cache is cache, "a relist updates the cache in place"
    assert sorted(cache) == ["ns/a", "ns/c", "ns/d"]
    assert cache["ns/a"]["metadata"]["resourceVersion"] == "12"


async def test_a_relist_keeps_listeners_and_the_cache_in_step() -> None:
    """At every event a listener sees the cache holding exactly what it was told; an object
    recreated under the same name meanwhile is reported gone, then new; an unchanged one is
    not reported at all."""

    def obj(name: str, rv: str, uid: str) -> dict[str, Any]:
        return {"metadata": {**cm(name, rv)["metadata"], "uid": uid}}

    api = ScriptedApi(
        lists=[
            ([obj("a", "1", "u-a"), obj("b", "1", "u-b"), obj("keep", "1", "u-k")], "10"),
            ([obj("b", "12", "u-b2"), obj("keep", "1", "u-k")], "13"),
        ],
        watches=[[{"type": "ERROR", "object": {"kind": "Status", "code": 410}}]],
    )
    informer = Informer(api, CONFIGMAPS)  # type: ignore[arg-type]
    seen: list[tuple[str, str, str]] = []

    def check(kind: str, o: dict[str, Any]) -> None:
        key = f"ns/{o['metadata']['name']}"
        if kind == "DELETED":
            assert key not in informer.cache
        else:
            assert informer.cache[key] is o
        seen.append((kind, o["metadata"]["name"], o["metadata"]["uid"]))

    informer.add_listener(check)
    task = asyncio.create_task(informer.run())
    for _ in range(200):
        if len(seen) == 6:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert seen == [
        ("ADDED", "a", "u-a"),
        ("ADDED", "b", "u-b"),
        ("ADDED", "keep", "u-k"),
        ("DELETED", "a", "u-a"),
        ("DELETED", "b", "u-b"),
        ("ADDED", "b", "u-b2"),
    ]
    assert informer.cache["ns/b"]["metadata"]["uid"] == "u-b2"


async def test_connection_errors_back_off_and_resume_from_last_version() -> None:
    api = ScriptedApi(
        lists=[([cm("a", "1")], "5")],
        watches=[
            ConnectionResetError("apiserver restarting"),
            [{"type": "ADDED", "object": cm("b", "6")}],
        ],
    )
    informer = Informer(api, CONFIGMAPS)  # type: ignore[arg-type]
    task = asyncio.create_task(informer.run())
    for _ in range(300):
        if "ns/b" in informer.cache:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert api.watched_from == ["5", "5"]
    assert informer.relists == 0
    assert sorted(informer.cache) == ["ns/a", "ns/b"]


async def test_a_transform_trims_what_is_cached_and_what_listeners_see() -> None:
    def big(name: str, rv: str) -> dict[str, Any]:
        return {**cm(name, rv), "data": {"payload": "x" * 1000}}

    api = ScriptedApi(
        lists=[([big("a", "1")], "5")],
        watches=[[{"type": "ADDED", "object": big("b", "6")}]],
    )
    informer = Informer(api, CONFIGMAPS, transform=lambda o: {"metadata": o["metadata"]})  # type: ignore[arg-type]
    seen: list[dict[str, Any]] = []
    informer.add_listener(lambda kind, obj: seen.append(obj))
    task = asyncio.create_task(informer.run())
    for _ in range(200):
        if len(seen) == 2:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert [o["metadata"]["name"] for o in seen] == ["a", "b"]
    assert all("data" not in o for o in [*seen, *informer.cache.values()])
    assert informer.resource_version == "6"
