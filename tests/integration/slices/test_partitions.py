"""Two slice publishers sharing the nodes (``partitions`` 2), as processes on a real NATS and
the local stack's apiserver: each writes only the nodes of the share whose Lease it holds,
every node's pool is written once; inventories stored before the stream had buckets are
filed in their bucket and written too; when one publisher is killed, the other takes its
share's Lease and writes a changed inventory of a node in that share."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from neuron_dra_cli.stack.components import python_service
from neuron_dra_common.bus import Bus
from neuron_dra_common.bus.declarations import INVENTORY, STREAMS, inventory_partition
from neuron_dra_common.events import NodeInventory
from neuron_dra_common.hardware.model import NeuronDevice, NodeHardware
from neuron_dra_common.kube import NODES, ApiException, KubeClient

from tests.fixtures.nats import NatsServer
from tests.fixtures.stack import KubeStack
from tests.fixtures.subscribers import ServiceProcess

NODES_COUNT = 12
#: Stored before the stream had buckets (an earlier release's stream).
LEGACY = 2
LEASE_SECONDS = 5


@pytest.fixture
async def nodes(kube: KubeClient) -> AsyncIterator[list[str]]:
    """Nodes without kubelets; their slices go with them."""
    run = uuid.uuid4().hex[:6]
    names = [f"share-{run}-{i}" for i in range(NODES_COUNT)]
    for name in names:
        await kube.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    try:
        yield names
    finally:
        for name in names:
            try:
                await kube.delete(NODES, name)
            except ApiException as exc:
                if exc.status != 404:
                    raise


@pytest.fixture
def publishers(
    nats_server: NatsServer, kube_stack: KubeStack, tmp_path: Path
) -> Iterator[list[ServiceProcess]]:
    """Two publishers with two shares, on the test's bus, with Leases of their own."""
    lease = f"shares-{uuid.uuid4().hex[:8]}"
    made = [
        ServiceProcess(
            python_service(
                name=f"slice-publisher-{who}",
                kind="slice-publisher",
                module="neuron_dra_slice_publisher",
                env={
                    "NEURON_DRA_KUBECONFIG": str(kube_stack.kubeconfig),
                    **nats_server.open_env,
                    "NEURON_DRA_IDENTITY": who,
                    "NEURON_DRA_LEASE_NAME": lease,
                    "NEURON_DRA_LEASE_SECONDS": str(LEASE_SECONDS),
                    "NEURON_DRA_PARTITIONS": "2",
                    "NEURON_DRA_LOG_LEVEL": "info",
                },
            ),
            log=tmp_path / f"slice-publisher-{who}.log",
        )
        for who in ("a", "b")
    ]
    try:
        yield made
    finally:
        for service in made:
            service.stop()


def inventory(node: str, generation: int, driver: str = "2.24.7.0") -> NodeInventory:
    return NodeInventory(
        node=node,
        boot_id="boot",
        generation=generation,
        hardware=NodeHardware(
            instance_type="trn2.48xlarge",
            driver_version=driver,
            devices=tuple(NeuronDevice(index=i) for i in range(16)),
        ),
    )


def pools(stack: KubeStack, names: list[str]) -> dict[str, list[dict[str, Any]]]:
    """The stored slices of each of ``names`` that has any."""
    found: dict[str, list[dict[str, Any]]] = {}
    for s in stack.get_json("resourceslices")["items"]:
        node = s["spec"].get("nodeName") or ""
        if node in names:
            found.setdefault(node, []).append(s)
    return found


def lease_holder(stack: KubeStack, name: str) -> str:
    out = stack.kubectl(
        "get", "lease", name, "-n", "neuron-dra-driver", "-o", "jsonpath={.spec.holderIdentity}"
    )
    return out.stdout.strip()


def written(service: ServiceProcess) -> set[str]:
    """The nodes whose pool this publisher wrote, from its log."""
    nodes: set[str] = set()
    for line in service.log.read_text(errors="replace").splitlines():
        if '"pool written"' in line:
            nodes.add(json.loads(line)["node"])
    return nodes


async def share_of(bus: Bus, names: list[str]) -> dict[str, int]:
    """Each node's share, from where the server filed its inventory."""
    shares: dict[str, int] = {}
    for p in range(2):
        for subject in inventory_partition(p, 2):
            info = await bus.js.stream_info(INVENTORY.name, subjects_filter=subject)
            for stored in info.state.subjects or {}:
                token = stored.rsplit(".", 1)[1]
                shares.update({n: p for n in names if n == token})
    return shares


async def wait_for(what: str, probe: Any, *, within: float = 60) -> Any:
    deadline = time.monotonic() + within
    while True:
        found = await asyncio.to_thread(probe)
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out after {within} s waiting for {what}"
        await asyncio.sleep(0.3)


async def test_two_publishers_share_the_nodes_and_take_over_each_others_share(
    nats_server: NatsServer,
    kube_stack: KubeStack,
    nodes: list[str],
    publishers: list[ServiceProcess],
) -> None:
    bus = await Bus.connect([nats_server.url], name="test")
    try:
        # An earlier release's inventory stream, without buckets, with two nodes in it.
        await bus.reconcile(
            streams=[
                msgspec.structs.replace(s, subject_transform=None) if s is INVENTORY else s
                for s in STREAMS
            ]
        )
        agents = bus.publisher(source="/test/discovery")
        for name in nodes[:LEGACY]:
            await agents.publish(inventory(name, 1))

        for service in publishers:
            service.start(wait_ready=False)
        for service in publishers:
            service.wait_ready()
        # The publishers gave the stream its buckets; the other nodes' agents publish now.
        deadline = time.monotonic() + 30
        while (await bus.js.stream_info(INVENTORY.name)).config.subject_transform is None:
            assert time.monotonic() < deadline, "the stream was not given its buckets"
            await asyncio.sleep(0.2)
        for name in nodes[LEGACY:]:
            await agents.publish(inventory(name, 1))

        stored = await wait_for(
            "every node's pool",
            lambda: len(found := pools(kube_stack, nodes)) == NODES_COUNT and found,
        )
        # Once each: one pool per node, written once (generation 1), one slice per name.
        for name, slices in stored.items():
            assert {s["spec"]["pool"]["generation"] for s in slices} == {1}, name
            assert len({s["metadata"]["name"] for s in slices}) == len(slices), name

        # Every inventory is in a bucket now, the earlier release's two included.
        shares = await share_of(bus, nodes)
        assert sorted(shares) == sorted(nodes)
        assert set(shares.values()) == {0, 1}, "all twelve nodes hashed to one share"

        # Each publisher holds one share's Lease and wrote exactly that share's nodes.
        lease = publishers[0].component.env["NEURON_DRA_LEASE_NAME"]
        holders = [lease_holder(kube_stack, f"{lease}-{p}-of-2") for p in range(2)]
        assert sorted(holders) == ["a", "b"]
        by_who = {"a": publishers[0], "b": publishers[1]}
        for p, who in enumerate(holders):
            assert written(by_who[who]) == {n for n, s in shares.items() if s == p}, who

        # The holder of share 0 dies; the other takes its Lease and writes a changed
        # inventory of a node in share 0.
        victim = by_who[holders[0]]
        survivor = holders[1]
        victim.kill9()
        node = next(n for n, s in shares.items() if s == 0)
        await agents.publish(inventory(node, 2, driver="2.25.0.0"))
        await wait_for(
            "share 0's Lease taken over",
            lambda: lease_holder(kube_stack, f"{lease}-0-of-2") == survivor,
            within=LEASE_SECONDS * 4,
        )
        rewritten = await wait_for(
            "the changed pool",
            lambda: (
                (found := pools(kube_stack, [node]).get(node, []))
                and all(s["spec"]["pool"]["generation"] == 2 for s in found)
                and found
            ),
        )
        assert "2.25.0.0" in json.dumps(rewritten)
        assert node in written(by_who[survivor])
    finally:
        await bus.close()
