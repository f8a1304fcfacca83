"""What the chaos checks read besides the apiserver: each node's kubelet plugin checkpoint and
CDI specs (files on the node), and the topology allocator's view (asked over the bus, as the
UltraServer operator asks it).

Both are one read per node or one request per check, so a check stays linear in the fleet.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterable
from pathlib import Path

from neuron_dra_cli.stack import state
from neuron_dra_common import cdi
from neuron_dra_common.bus import ALLOCATOR_SUBJECT, Bus, BusCredentials, RpcError, request
from neuron_dra_common.events import (
    AllocationDecided,
    AllocationReleased,
    AllocationRequested,
    ObjectRef,
)
from neuron_dra_kubelet_plugin.checkpoint import CheckpointError, CheckpointStore
from neuron_dra_kubelet_plugin.registration import socket_paths

from chaos.invariants import held_on_node

__all__ = ["PROBE", "ask_allocator", "checkpoint_path", "node_files_problems"]

#: The workload the allocator is asked for: it names no object and is never granted.
PROBE = ObjectRef(namespace="chaos", name="allocator-probe")
#: Reads of a checkpoint the plugin is rewriting right then before it counts as unreadable.
_READ_TRIES = 3


def checkpoint_path(plugin: state.ComponentState) -> Path:
    """Where ``plugin`` (a kubelet-plugin component) keeps its checkpoint."""
    paths = socket_paths(Path(plugin.env["NEURON_DRA_KUBELET_ROOT"]))
    return paths.dra.parent / "checkpoint.json"


def _checkpoint(plugin: state.ComponentState) -> dict[str, list[str]] | str:
    """Claim UID -> devices the claims of the plugin's checkpoint hold, or why it cannot be
    read. A device allocated with admin access (a monitor's) holds nothing and is left out."""
    store = CheckpointStore(checkpoint_path(plugin))
    error = ""
    for _ in range(_READ_TRIES):
        try:
            claims = store.load().claims
        except CheckpointError as exc:  # replaced between the base and its journal: again
            error = str(exc)
            continue
        finally:
            store.close()
        return {
            uid: [d.device for d in entry.devices if not d.admin_access]
            for uid, entry in claims.items()
        }
    return error


def _specs(cdi_root: Path) -> dict[str, list[str]]:
    """Claim UID -> the host device nodes its CDI spec injects (each once per spec)."""
    out: dict[str, list[str]] = {}
    for uid in cdi.claim_spec_uids(cdi_root):
        try:
            spec = cdi.read_claim_spec(cdi_root, uid)
        except (cdi.CdiError, ValueError):
            continue  # being replaced right now; the next check reads it
        if spec is None:
            continue  # removed since the listing
        nodes = {
            n.host_path or n.path for d in spec.devices for n in d.container_edits.device_nodes
        }
        out[uid] = sorted(nodes)
    return out


def node_files_problems(plugins: Iterable[state.ComponentState]) -> list[str]:
    """Each device a node's checkpoint or CDI specs hold twice, for every node's plugin."""
    problems: list[str] = []
    for plugin in plugins:
        node = plugin.env["NEURON_DRA_NODE_NAME"]
        held = _checkpoint(plugin)
        if isinstance(held, str):
            problems.append(f"node {node}: checkpoint unreadable: {held}")
            held = {}
        specs = _specs(Path(plugin.env["NEURON_DRA_CDI_ROOT"]))
        # An admin-access claim's spec injects devices other claims hold: not a second holder.
        monitors = {uid for uid, devices in held.items() if not devices}
        specs = {uid: nodes for uid, nodes in specs.items() if uid not in monitors}
        problems += held_on_node(node, held, specs)
    return problems


async def _ask(nats_url: str, credentials: BusCredentials, servers: int) -> AllocationDecided:
    bus = await Bus.connect([nats_url], name="chaos-allocator-probe", credentials=credentials)
    probe = ObjectRef(namespace=PROBE.namespace, name=PROBE.name, uid=f"probe-{uuid.uuid4()}")
    try:
        answer = await request(
            bus,
            ALLOCATOR_SUBJECT,
            AllocationRequested(
                request_id=str(uuid.uuid4()),
                workload=probe,
                topology_size=4,
                server_count=servers + 1,
            ),
            wait=10.0,
        )
        if isinstance(answer, AllocationDecided) and answer.granted:
            # More free than the fleet has: give it back (the check reports it).
            released = AllocationReleased(request_id=str(uuid.uuid4()), workload=probe)
            await request(bus, ALLOCATOR_SUBJECT, released, wait=10.0)
    finally:
        await bus.close()
    if not isinstance(answer, AllocationDecided):
        raise RpcError(f"{ALLOCATOR_SUBJECT}: answered {answer.event_type()}")
    return answer


def ask_allocator(nats_url: str, credentials: BusCredentials, servers: int) -> AllocationDecided:
    """The allocator's answer to a request for one more whole UltraServer than the fleet's
    ``servers``: never granted, its refusal says how many whole UltraServers are free and why
    the others are not (which workloads hold their nodes). One request, whatever the fleet."""
    # The probe's own connection closing is expected: keep its warnings out of the run's output.
    quiet = [logging.getLogger(name) for name in ("asyncio", "neuron_dra_common.bus.connection")]
    levels = [q.level for q in quiet]
    for q in quiet:
        q.setLevel(logging.ERROR)
    try:
        return asyncio.run(_ask(nats_url, credentials, servers))
    finally:
        for q, level in zip(quiet, levels, strict=True):
            q.setLevel(level)
