"""The informer after a 410 Gone on the real apiserver: it lists again and brings the same
cache up to date in place, so whoever holds the cache (a controller's reconciler) sees the
changes made while its watch was gone, and every listener sees the cache in step.

The 410 is the apiserver's own: updating a CustomResourceDefinition's spec (as an upgrade of
the CRDs does) rebuilds the resource's storage and watch cache, and a watch resumed from a
version before that is answered "too old resource version".
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import pytest
from neuron_dra_common.kube import (
    ApiException,
    Informer,
    KubeClient,
    Resource,
    apply,
)
from neuron_dra_common.kube.client import Obj

from tests.contracts.support import wait_until

pytestmark = pytest.mark.stack

NS = "default"
GROUP = "relist.neuron-dra.test"
WIDGETS = Resource(group=GROUP, version="v1", plural="widgets", kind="Widget", namespaced=True)
CRDS = Resource(
    group="apiextensions.k8s.io",
    version="v1",
    plural="customresourcedefinitions",
    kind="CustomResourceDefinition",
)


def crd(description: str) -> dict[str, Any]:
    schema = {
        "type": "object",
        "description": description,
        "x-kubernetes-preserve-unknown-fields": True,
    }
    return {
        "metadata": {"name": f"widgets.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


class CutOffClient(KubeClient):
    """A real client of the same apiserver, whose informer can be cut off: its next watch
    waits until released (a network partition), then resumes from where the informer left
    off."""

    def __init__(self, client: KubeClient) -> None:
        super().__init__(client.config)
        self.cut = False
        self.away = asyncio.Event()
        self.back = asyncio.Event()
        self.errors: list[Obj] = []

    async def watch(
        self,
        resource: Resource,
        *,
        resource_version: str,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
        timeout_seconds: int = 300,
        metadata_only: bool = False,
    ) -> AsyncGenerator[Obj, None]:
        if self.cut:
            self.cut = False
            self.away.set()
            await self.back.wait()
        async for event in super().watch(
            resource,
            resource_version=resource_version,
            namespace=namespace,
            label_selector=label_selector,
            field_selector=field_selector,
            timeout_seconds=timeout_seconds,
            metadata_only=metadata_only,
        ):
            if event.get("type") == "ERROR":
                self.errors.append(event.get("object") or {})
            yield event


def widget(name: str, run: str, **data: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": NS, "labels": {"test-run": run}},
        "data": data,
    }


async def established(kube: KubeClient, description: str) -> bool:
    obj = await kube.get(CRDS, f"widgets.{GROUP}")
    conditions = (obj.get("status") or {}).get("conditions") or ()
    served = obj["spec"]["versions"][0]["schema"]["openAPIV3Schema"].get("description")
    return served == description and any(
        c["type"] == "Established" and c["status"] == "True" for c in conditions
    )


# A socket of the cut-off client is now and then collected unclosed on a loaded machine (the
# TLS connection of a watch given up during the 410); the informer's behaviour is what this
# test checks, the stray socket is followed apart.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_relist_after_gone_updates_the_cache_in_place(kube: KubeClient) -> None:
    run = uuid.uuid4().hex[:10]
    put = "test"
    await apply(kube, CRDS, crd(f"before {run}"), field_manager=put)
    await wait_until_async(lambda: established(kube, f"before {run}"), what="the CRD")
    await wait_until_async(lambda: serving(kube), what="widgets served")
    for name, v in (("keep", "1"), ("change", "1"), ("gone", "1"), ("again", "1")):
        await apply(kube, WIDGETS, widget(f"{name}-{run}", run, v=v), field_manager=put)
    client = CutOffClient(kube)
    informer = Informer(
        client, WIDGETS, namespace=NS, label_selector=f"test-run={run}", watch_timeout=2
    )
    cache = informer.cache  # what a reconciler holds on to
    seen: list[tuple[str, str]] = []
    out_of_step: list[str] = []

    def listener(kind: str, obj: dict[str, Any]) -> None:
        key = f"{NS}/{obj['metadata']['name']}"
        held = cache.get(key)
        if (kind == "DELETED") != (held is None) or (held is not None and held is not obj):
            out_of_step.append(f"{kind} {key}")
        seen.append((kind, obj["metadata"]["name"].removesuffix(f"-{run}")))

    informer.add_listener(listener)
    task = asyncio.create_task(informer.run(), name="relist-informer")
    try:
        await asyncio.wait_for(informer.wait_synced(), 30)
        kept = cache[f"{NS}/keep-{run}"]
        old_again_uid = cache[f"{NS}/again-{run}"]["metadata"]["uid"]
        seen.clear()
        # Cut off at the end of the current watch (at most watch_timeout from now).
        client.cut = True
        await asyncio.wait_for(client.away.wait(), 30)
        await apply(kube, WIDGETS, widget(f"change-{run}", run, v="2"), field_manager=put)
        await kube.delete(WIDGETS, f"gone-{run}", namespace=NS)
        await kube.delete(WIDGETS, f"again-{run}", namespace=NS)
        await apply(kube, WIDGETS, widget(f"again-{run}", run, v="2"), field_manager=put)
        await apply(kube, WIDGETS, widget(f"new-{run}", run, v="1"), field_manager=put)
        # The CRDs are upgraded meanwhile: every version before now expires.
        await apply(kube, CRDS, crd(f"after {run}"), field_manager=put)
        await wait_until_async(lambda: established(kube, f"after {run}"), what="the new CRD")
        client.back.set()
        await wait_until(lambda: informer.relists == 1, within=30, what="a relist")
        await wait_until(lambda: len(seen) >= 5, within=30, what="the changes reported")

        assert [e.get("code") for e in client.errors] == [410], client.errors
        assert "too old resource version" in client.errors[0].get("message", "")
        assert informer.cache is cache
        assert sorted(cache) == [f"{NS}/{n}-{run}" for n in ("again", "change", "keep", "new")], (
            "the gone one is removed, the new one added"
        )
        assert cache[f"{NS}/change-{run}"]["data"] == {"v": "2"}
        assert cache[f"{NS}/again-{run}"]["metadata"]["uid"] != old_again_uid
        assert cache[f"{NS}/keep-{run}"] is kept, "an unchanged object is left as it was"
        # Gone first, then the list in order; a namesake with another UID is gone, then new.
        relisted = [
            ("DELETED", "gone"),
            ("DELETED", "again"),
            ("ADDED", "again"),
            ("MODIFIED", "change"),
            ("ADDED", "new"),
        ]
        # The resumed watch may still deliver the first change from the old storage before
        # its 410; the relist then finds that object up to date and does not report it again.
        watched_first = [("MODIFIED", "change"), *(e for e in relisted if e[1] != "change")]
        assert seen in (relisted, watched_first), seen
        assert out_of_step == []

        # And the watch goes on from the relist's version.
        await apply(kube, WIDGETS, widget(f"keep-{run}", run, v="3"), field_manager=put)
        await wait_until(
            lambda: cache[f"{NS}/keep-{run}"]["data"] == {"v": "3"}, within=30, what="watch"
        )
        assert informer.relists == 1
    finally:
        informer.stop()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.close()
        with contextlib.suppress(ApiException):
            await kube.delete(CRDS, f"widgets.{GROUP}")


async def serving(kube: KubeClient) -> bool:
    try:
        await kube.list(WIDGETS, namespace=NS)
    except ApiException as exc:
        if exc.status in (404, 503):
            return False
        raise
    return True


async def wait_until_async(
    check: Callable[[], Awaitable[bool]], *, within: float = 30, what: str
) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(0.2)
