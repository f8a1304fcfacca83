"""The extender's pod watch through a relist: a pod bound while the watch was down (410 Gone)
is seen bound afterwards, so the devices it holds are never handed out again."""

from __future__ import annotations

import asyncio
from typing import Any

from neuron_dra_scheduler_extender.cluster import KubeCluster
from neuron_dra_scheduler_extender.extender import Extender
from neuron_dra_scheduler_extender.inputs import Ask
from neuron_dra_scheduler_extender.ledger import annotations_for

from tests.unit.kube.test_informer_recovery import ScriptedApi

from .helpers import pod_obj


def versioned(pod: dict[str, Any], rv: str) -> dict[str, Any]:
    return {**pod, "metadata": {**pod["metadata"], "resourceVersion": rv}}


async def test_a_pod_bound_while_the_watch_was_down_is_seen_bound_after_the_relist() -> None:
    pending = pod_obj("held", count=4)
    bound = pod_obj(
        "held",
        count=4,
        node_name="trn2-0",
        annotations=annotations_for(
            ask=Ask(resource="aws.amazon.com/neuron", count=4), ids=(0, 1, 2, 3), node="trn2-0",
            now_ns=1,
        ),
    )  # fmt: skip
    api = ScriptedApi(
        lists=[([versioned(pending, "1")], "10"), ([versioned(bound, "12")], "13")],
        watches=[[{"type": "ERROR", "object": {"kind": "Status", "code": 410}}], []],
    )
    cluster = KubeCluster(api)  # type: ignore[arg-type]
    extender = Extender(cluster)
    cluster.follow(extender)
    task = asyncio.create_task(cluster.pods.run())
    try:
        for _ in range(200):
            if cluster.pods.relists:
                break
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    held = extender.ledger.get(pending["metadata"]["uid"])
    assert held is not None
    assert (held.node, held.ids) == ("trn2-0", (0, 1, 2, 3))
    known = cluster.known_pod("default", "held")
    assert known is not None
    assert known.spec.node_name == "trn2-0"
