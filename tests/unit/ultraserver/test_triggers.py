"""Which workloads and UltraServers a change queues, found through the node index."""

from __future__ import annotations

import asyncio
from typing import Any

from neuron_dra_common.kube import WorkQueue
from neuron_dra_ultraserver_operator.fleet import Fleet, FleetIndex
from neuron_dra_ultraserver_operator.triggers import Holders, Triggers

Obj = dict[str, Any]


def workload(name: str, *nodes: str) -> Obj:
    return {
        "metadata": {"name": name, "namespace": "ml"},
        "status": {
            "state": "Allocated",
            "allocations": [
                {"ultraServer": "us-a", "nodes": [{"nodeName": n} for n in nodes]},
            ],
        },
    }


def test_the_index_follows_what_each_workload_holds() -> None:
    holders = Holders()
    holders.update("ml/a", workload("a", "n0", "n1"))
    holders.update("ml/b", workload("b", "n2"))
    assert holders.of("n1") == ("ml/a",)
    holders.update("ml/a", workload("a", "n1", "n2"))  # replaced n0 with n2
    assert holders.of("n0") == ()
    assert holders.of("n2") == ("ml/a", "ml/b")
    holders.update("ml/b", None)
    assert holders.of("n2") == ("ml/a",)
    assert holders.of("nowhere") == ()


async def drain(queue: WorkQueue[str]) -> set[str]:
    keys = set()
    while len(queue):
        key = await queue.get()
        keys.add(key)
        queue.done(key)
    return keys


def test_a_node_record_change_queues_only_the_workloads_holding_the_node() -> None:
    async def scenario() -> None:
        node: Obj = {
            "metadata": {"name": "n1", "labels": {}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }
        nodes = {"n1": node}
        fleet = Fleet(nodes, {})
        wq: WorkQueue[str] = WorkQueue(name="workloads")
        uq: WorkQueue[str] = WorkQueue(name="ultraservers")
        triggers = Triggers(
            workloads={},
            fleet=fleet,
            index=FleetIndex(fleet, nodes),
            workload_queue=wq,
            ultraserver_queue=uq,
        )
        triggers.on_node("ADDED", node)  # seen by discovery: taken in the settled pass
        triggers.on_workload("ADDED", workload("a", "n0", "n1"))
        triggers.on_workload("ADDED", workload("b", "n2"))
        await asyncio.sleep(0.2)
        await drain(wq)
        await drain(uq)
        annotated = {**node, "metadata": {**node["metadata"], "annotations": {"x": "y"}}}
        nodes["n1"] = annotated
        triggers.on_node("MODIFIED", annotated)
        assert await drain(wq) == {"ml/a"}

    asyncio.run(scenario())
