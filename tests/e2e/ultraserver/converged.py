"""What "converged" means for one workload on the UltraServer stack, checked where a user
would look: the workload's status, the Nodes' allocation records, the ResourceClaimTemplate,
the devices' ``workloadId`` tags, and the topology allocator itself (asked over NATS what it
would still grant)."""

from __future__ import annotations

import asyncio
import re
import textwrap
import uuid
from typing import Any

from neuron_dra_common.bus import ALLOCATOR_SUBJECT, Bus, request
from neuron_dra_common.events import (
    AllocationDecided,
    AllocationReleased,
    AllocationRequested,
    ObjectRef,
)
from neuron_dra_common.ultraserver import NODE_ALLOCATION, WORKLOAD_UID_LABEL

from tests.fixtures.stack import KubeStack, neuron_dra

INSTANCE = "trn2u.48xlarge"
#: The stack's fleet (tests/fleets/ultraserver.yaml): three UltraServers of four nodes.
ULTRASERVERS = 3


def workload(
    name: str, *, size: int, count: int = 1, strategy: str = "NoOp", template: str | None = None
) -> str:
    """A NeuronUltraServerWorkload manifest, as a user writes it (``template``: the name of
    the ResourceClaimTemplate it fills, when not the default)."""
    named = f"\n  resourceClaimTemplate:\n    name: {template}" if template else ""
    return (
        textwrap.dedent(
            f"""\
        apiVersion: neuron.aws.com/v1beta1
        kind: NeuronUltraServerWorkload
        metadata:
          name: {name}
          namespace: default
        spec:
          instanceType: {INSTANCE}
          topologySize: {size}
          serverCount: {count}
          allocationPolicy:
            failureStrategy: {strategy}"""
        )
        + named
        + "\n"
    )


def deployment(name: str, *, template: str, replicas: int) -> str:
    """A Deployment of ``replicas`` pods, each with a claim from ResourceClaimTemplate
    ``template``, as AWS's guide writes them."""
    return textwrap.dedent(
        f"""\
        apiVersion: apps/v1
        kind: Deployment
        metadata:
          name: {name}
        spec:
          replicas: {replicas}
          selector:
            matchLabels:
              app: {name}
          template:
            metadata:
              labels:
                app: {name}
            spec:
              resourceClaims:
                - name: neuron-claim
                  resourceClaimTemplateName: {template}
              containers:
                - name: training-container
                  image: public.ecr.aws/docker/library/alpine:latest
                  command: ["sleep", "infinity"]
                  resources:
                    claims:
                      - name: neuron-claim
        """
    )


def status_of(stack: KubeStack, name: str) -> dict[str, Any]:
    status: dict[str, Any] = stack.get_json("nusw", name).get("status") or {}
    return status


def wait_state(stack: KubeStack, name: str, want: str, *, timeout: float = 90) -> dict[str, Any]:
    result: dict[str, Any] = stack.wait_for(
        f"{name} {want}",
        lambda: (s := status_of(stack, name)).get("state") == want and s,
        timeout=timeout,
    )
    return result


def exists(stack: KubeStack, *args: str) -> bool:
    return stack.kubectl("get", *args, check=False).returncode == 0


def wait_no_workloads(stack: KubeStack, *, timeout: float = 120) -> None:
    """Other tests' workloads are gone (their cascade may still be running)."""
    stack.wait_for(
        "no NeuronUltraServerWorkload left",
        lambda: not stack.get_json("nusw", "-A")["items"],
        timeout=timeout,
    )


def node_records(stack: KubeStack) -> dict[str, str]:
    """Node -> the allocation record written on it (raw JSON)."""
    out: dict[str, str] = {}
    for node in stack.get_json("nodes")["items"]:
        value = (node["metadata"].get("annotations") or {}).get(NODE_ALLOCATION)
        if value:
            out[node["metadata"]["name"]] = value
    return out


def tagged(stack: KubeStack, workload_id: str) -> dict[str, int]:
    """Node -> how many of its devices carry ``workloadId == workload_id``."""
    out: dict[str, int] = {}
    for s in stack.get_json("resourceslices")["items"]:
        node = s["spec"].get("nodeName")
        for device in s["spec"].get("devices") or ():
            tag = (device.get("attributes") or {}).get("workloadId") or {}
            if tag.get("string") == workload_id:
                out[node] = out.get(node, 0) + 1
    return out


def all_devices_tagged(stack: KubeStack, nodes: set[str], workload_id: str) -> bool:
    slices = stack.get_json("resourceslices")["items"]
    devices = [
        d
        for s in slices
        if s["spec"].get("nodeName") in nodes
        for d in s["spec"].get("devices") or ()
    ]
    return (
        bool(devices)
        and all(
            ((d.get("attributes") or {}).get("workloadId") or {}).get("string") == workload_id
            for d in devices
        )
        and set(tagged(stack, workload_id)) == nodes
    )


def templates_of(stack: KubeStack, uid: str) -> list[str]:
    items = stack.get_json("resourceclaimtemplates", "-A", "-l", f"{WORKLOAD_UID_LABEL}={uid}")[
        "items"
    ]
    return [f"{t['metadata']['namespace']}/{t['metadata']['name']}" for t in items]


def free_ultraservers(stack: KubeStack) -> tuple[int, set[str]]:
    """How many whole UltraServers the allocator would still grant, and which nodes.

    Asks for all of them, then fewer, with a probe UID, and gives each probe back.
    """

    async def probe() -> tuple[int, set[str]]:
        bus = await Bus.connect(
            [stack.nats_url], name="converged-probe", credentials=stack.bus_credentials()
        )
        try:
            for count in range(ULTRASERVERS, 0, -1):
                ref = ObjectRef(namespace="default", name="probe", uid=f"probe-{uuid.uuid4()}")
                answer = await request(
                    bus,
                    ALLOCATOR_SUBJECT,
                    AllocationRequested(
                        request_id=ref.uid,
                        workload=ref,
                        topology_size=4,
                        server_count=count,
                        instance_type=INSTANCE,
                        generation=1,
                    ),
                    wait=10,
                )
                assert isinstance(answer, AllocationDecided), answer
                if answer.granted:
                    await request(
                        bus,
                        ALLOCATOR_SUBJECT,
                        AllocationReleased(request_id=f"release-{ref.uid}", workload=ref),
                        wait=10,
                    )
                    return count, set(answer.nodes)
            return 0, set()
        finally:
            await bus.close()

    return asyncio.run(probe())


def assert_allocated_once(stack: KubeStack, name: str, status: dict[str, Any]) -> None:
    """One whole UltraServer held by ``name``, recorded the same way everywhere."""
    uid = stack.get_json("nusw", name)["metadata"]["uid"]
    nodes = [n["nodeName"] for a in status["allocations"] for n in a["nodes"]]
    assert len(nodes) == 4, status
    assert len(set(nodes)) == 4, f"a node allocated twice: {nodes}"
    assert len(status["allocatedUltraServers"]) == 1, status
    assert status["totalNodesAllocated"] == 4
    records = node_records(stack)
    held = {n for n, raw in records.items() if uid in raw}
    assert held == set(nodes), f"node records {sorted(held)}, status {sorted(nodes)}"
    assert all('"phase":"Bound"' in records[n] for n in nodes), {n: records[n] for n in nodes}
    assert templates_of(stack, uid) == [f"default/{status['resourceClaimTemplate']}"]
    stack.wait_for(
        f"workloadId {name} on exactly its nodes' devices",
        lambda: all_devices_tagged(stack, set(nodes), name),
        timeout=60,
    )
    free, probe_nodes = free_ultraservers(stack)
    assert free == ULTRASERVERS - 1, f"the allocator grants {free} UltraServers more"
    assert not probe_nodes & set(nodes), "the allocator hands out the workload's nodes"


def assert_released(stack: KubeStack, name: str, uid: str, *, held_by_others: int = 0) -> None:
    """Nothing of ``name`` is left: no record, template, tag or allocation (other workloads
    hold ``held_by_others`` UltraServers)."""
    assert not exists(stack, "nusw", name)
    assert not [n for n, raw in node_records(stack).items() if uid in raw]
    assert templates_of(stack, uid) == []
    stack.wait_for(f"no device tagged {name}", lambda: not tagged(stack, name), timeout=60)
    free, _ = free_ultraservers(stack)
    assert free == ULTRASERVERS - held_by_others, f"the allocator grants {free} UltraServers"


def pod_env(stack: KubeStack, pod: str) -> dict[str, str]:
    proc = neuron_dra("dev", "env", pod, "--state-dir", str(stack.state_dir), timeout=60)
    assert proc.returncode == 0, proc.stderr
    return dict(re.findall(r'export (\w+)="([^"]*)"', proc.stdout))
