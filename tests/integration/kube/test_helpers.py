"""Kubernetes helpers against the local stack's real apiserver."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

import pytest
from neuron_dra_common.kube import (
    CONFIGMAPS,
    Informer,
    KubeClient,
    WorkQueue,
    apply,
    object_key,
    run_workers,
)

from tests.contracts.support import wait_until

pytestmark = pytest.mark.stack

NS = "default"


def configmap(name: str, run: str, **data: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": NS, "labels": {"test-run": run}},
        "data": data,
    }


async def test_informer_lists_then_follows_every_change(kube: KubeClient) -> None:
    run = uuid.uuid4().hex[:10]
    await apply(kube, CONFIGMAPS, configmap(f"a-{run}", run, v="1"), field_manager="test")
    informer = Informer(kube, CONFIGMAPS, namespace=NS, label_selector=f"test-run={run}")
    seen: list[tuple[str, str]] = []
    informer.add_listener(lambda kind, obj: seen.append((kind, obj["metadata"]["name"])))
    task = asyncio.create_task(informer.run(), name="test-informer")
    try:
        await asyncio.wait_for(informer.wait_synced(), 30)
        assert list(informer.cache) == [f"{NS}/a-{run}"]
        await apply(kube, CONFIGMAPS, configmap(f"b-{run}", run, v="1"), field_manager="test")
        await apply(kube, CONFIGMAPS, configmap(f"a-{run}", run, v="2"), field_manager="test")
        await kube.delete(CONFIGMAPS, f"b-{run}", namespace=NS)
        await wait_until(lambda: len(seen) >= 4, within=30, what="four events")
    finally:
        informer.stop()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert seen == [
        ("ADDED", f"a-{run}"),
        ("ADDED", f"b-{run}"),
        ("MODIFIED", f"a-{run}"),
        ("DELETED", f"b-{run}"),
    ]
    assert informer.cache[f"{NS}/a-{run}"]["data"] == {"v": "2"}
    await kube.delete(CONFIGMAPS, f"a-{run}", namespace=NS)


async def test_a_metadata_informer_follows_changes_without_the_objects_bodies(
    kube: KubeClient,
) -> None:
    run = uuid.uuid4().hex[:10]
    await apply(kube, CONFIGMAPS, configmap(f"a-{run}", run, v="1"), field_manager="test")
    informer = Informer(
        kube, CONFIGMAPS, namespace=NS, label_selector=f"test-run={run}", metadata_only=True
    )
    seen: list[tuple[str, str, str]] = []
    informer.add_listener(
        lambda kind, obj: seen.append((kind, obj["kind"], obj["metadata"]["name"]))
    )
    task = asyncio.create_task(informer.run(), name="test-informer")
    try:
        await asyncio.wait_for(informer.wait_synced(), 30)
        changed = configmap(f"a-{run}", run, v="2")
        changed["metadata"]["annotations"] = {"test/step": "2"}
        await apply(kube, CONFIGMAPS, changed, field_manager="test")
        await wait_until(lambda: len(seen) >= 2, within=30, what="two events")
    finally:
        informer.stop()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    kind = "PartialObjectMetadata"
    assert seen == [("ADDED", kind, f"a-{run}"), ("MODIFIED", kind, f"a-{run}")]
    cached = informer.cache[f"{NS}/a-{run}"]
    assert "data" not in cached
    assert "managedFields" not in cached["metadata"]
    assert cached["metadata"]["uid"]
    assert cached["metadata"]["annotations"] == {"test/step": "2"}
    assert cached["metadata"]["labels"] == {"test-run": run}
    await kube.delete(CONFIGMAPS, f"a-{run}", namespace=NS)


async def test_a_metadata_informer_of_nothing_syncs(kube: KubeClient) -> None:
    # The server answers an empty PartialObjectMetadataList with "items": null.
    run = uuid.uuid4().hex[:10]
    informer = Informer(
        kube, CONFIGMAPS, namespace=NS, label_selector=f"test-run={run}", metadata_only=True
    )
    task = asyncio.create_task(informer.run(), name="test-informer")
    try:
        await asyncio.wait_for(informer.wait_synced(), 30)
        assert informer.cache == {}
        assert informer.resource_version
    finally:
        informer.stop()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_level_triggered_reconcile_sees_latest_state(kube: KubeClient) -> None:
    run = uuid.uuid4().hex[:10]
    informer = Informer(kube, CONFIGMAPS, namespace=NS, label_selector=f"test-run={run}")
    queue: WorkQueue[str] = WorkQueue(name="test")
    informer.add_listener(lambda kind, obj: queue.add(object_key(obj)))
    reconciled: dict[str, str] = {}

    async def reconcile(key: str) -> None:
        obj = informer.cache.get(key)
        reconciled[key] = obj["data"]["v"] if obj else "<gone>"

    tasks = [
        asyncio.create_task(informer.run(), name="test-informer"),
        asyncio.create_task(run_workers(queue, reconcile, workers=2), name="test-workers"),
    ]
    try:
        await asyncio.wait_for(informer.wait_synced(), 30)
        for v in range(5):
            await apply(kube, CONFIGMAPS, configmap(f"c-{run}", run, v=str(v)), field_manager="t")
        key = f"{NS}/c-{run}"
        await wait_until(lambda: reconciled.get(key) == "4", within=30, what="latest state")
        await kube.delete(CONFIGMAPS, f"c-{run}", namespace=NS)
        await wait_until(lambda: reconciled.get(key) == "<gone>", within=30, what="deletion")
    finally:
        informer.stop()
        queue.shutdown()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_server_side_apply_keeps_each_managers_fields(kube: KubeClient) -> None:
    run = uuid.uuid4().hex[:10]
    name = f"ssa-{run}"
    await apply(kube, CONFIGMAPS, configmap(name, run, a="1", x="1"), field_manager="svc-a")
    await apply(kube, CONFIGMAPS, configmap(name, run, b="1"), field_manager="svc-b")
    stored = await apply(kube, CONFIGMAPS, configmap(name, run, a="2"), field_manager="svc-a")
    try:
        assert stored["data"] == {"a": "2", "b": "1"}  # svc-a dropped x; svc-b's b stays
        managers = {m["manager"]: m["operation"] for m in stored["metadata"]["managedFields"]}
        assert managers == {"svc-a": "Apply", "svc-b": "Apply"}
    finally:
        await kube.delete(CONFIGMAPS, name, namespace=NS)


async def test_api_errors_name_the_object(kube: KubeClient) -> None:
    from neuron_dra_common.kube import ApiException

    with pytest.raises(ApiException) as caught:
        await kube.get(CONFIGMAPS, "does-not-exist", namespace=NS)
    assert caught.value.status == 404
    assert 'configmaps "does-not-exist" not found' in str(caught.value)


async def test_request_bodies_and_queries_reach_the_apiserver_intact(kube: KubeClient) -> None:
    run = uuid.uuid4().hex[:10]
    name = f"body-{run}"
    # Non-ASCII text, a large value and characters a query must escape all survive the trip.
    big = "x" * 200_000
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        **configmap(name, run, text="Grüße ✓", big=big),
    }
    created = await kube.create(CONFIGMAPS, body)
    try:
        assert created["data"] == {"text": "Grüße ✓", "big": big}
        items, _ = await kube.list(
            CONFIGMAPS,
            namespace=NS,
            label_selector=f"test-run={run},test-run in ({run},other)",
        )
        assert [o["metadata"]["name"] for o in items] == [name]
    finally:
        await kube.delete(CONFIGMAPS, name, namespace=NS)


async def test_patch_kinds_preconditions_dry_run_and_metadata_answers(kube: KubeClient) -> None:
    from neuron_dra_common.kube import ApiException

    run = uuid.uuid4().hex[:10]
    name = f"verbs-{run}"
    body = {"apiVersion": "v1", "kind": "ConfigMap", **configmap(name, run, a="1")}
    assert "data" not in await kube.create(CONFIGMAPS, body, dry_run=True, metadata_only=True)
    with pytest.raises(ApiException) as missing:
        await kube.get(CONFIGMAPS, name, namespace=NS)
    assert missing.value.status == 404, "a dry run stores nothing"
    created = await kube.create(CONFIGMAPS, body, metadata_only=True)
    assert "data" not in created
    assert "managedFields" not in created["metadata"]
    uid, version = created["metadata"]["uid"], created["metadata"]["resourceVersion"]
    try:
        await kube.patch(CONFIGMAPS, name, {"data": {"m": "1"}}, namespace=NS)
        await kube.patch(CONFIGMAPS, name, {"data": {"s": "1"}}, namespace=NS, kind="strategic")
        ops = [{"op": "add", "path": "/data/j", "value": "1"}]
        patched = await kube.patch(CONFIGMAPS, name, ops, namespace=NS, kind="json")
        assert patched["data"] == {"a": "1", "m": "1", "s": "1", "j": "1"}
        for stale in ({"uid": "not-its-uid"}, {"resource_version": version}):
            with pytest.raises(ApiException) as refused:
                await kube.delete(CONFIGMAPS, name, namespace=NS, **stale)
            assert refused.value.status == 409
        await kube.get(CONFIGMAPS, name, namespace=NS)  # still there
        await kube.delete(CONFIGMAPS, name, namespace=NS, uid=uid, propagation="Foreground")
    finally:
        with contextlib.suppress(ApiException):
            await kube.delete(CONFIGMAPS, name, namespace=NS)


async def test_status_subresource_and_events(kube: KubeClient) -> None:
    from neuron_dra_common.kube import EVENTS, NODES

    name = f"verbs-node-{uuid.uuid4().hex[:8]}"
    node = await kube.create(
        NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
    )
    try:
        condition = {"type": "NeuronHealth", "status": "True", "reason": "Test", "message": "ok"}
        await kube.patch_status(
            NODES, name, {"status": {"conditions": [condition]}}, kind="strategic"
        )
        current = await kube.get_status(NODES, name)
        assert [c["type"] for c in current["status"]["conditions"]] == ["NeuronHealth"]
        current["status"]["conditions"][0]["message"] = "replaced"
        await kube.replace_status(NODES, name, current)
        assert (await kube.get(NODES, name))["status"]["conditions"][0]["message"] == "replaced"
        await kube.post_event(
            {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node["metadata"]["uid"]},
            reason="VerbsTest",
            message="x" * 5000,
            component="test",
            warning=True,
        )
        events, _ = await kube.list(
            EVENTS, namespace="default", field_selector=f"involvedObject.name={name}"
        )
        [event] = events
        assert (event["reason"], event["type"]) == ("VerbsTest", "Warning")
        assert len(event["message"]) == 1024
    finally:
        await kube.delete(NODES, name)


async def test_the_server_version_is_the_apiservers_release(kube: KubeClient) -> None:
    """``/version`` as explain reads it to know which scheduler checks apply."""
    from neuron_dra_cli.kubebuild import DEFAULT_VERSION

    # The session's stack runs the default release, built from the official modules.
    assert await kube.server_version() == f"v{DEFAULT_VERSION}"
