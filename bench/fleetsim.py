"""N simulated Neuron nodes without kubelets, in one asyncio process.

For each node it does what the node's kubelet and agents would do, at their own intervals:

* **kubelet**: creates the Node (the labels EKS puts on it) and posts it Ready, creates its
  Lease in ``kube-node-lease`` and renews it every :data:`LEASE_SECONDS` (the kubelet's
  ``nodeLeaseDurationSeconds`` / 4), and posts its status again every
  :data:`STATUS_SECONDS` (the kubelet's ``nodeStatusReportFrequency`` when nothing changed);
* **discovery**: its NodeInventory once, then a NodeHeartbeat every
  :data:`HEARTBEAT_SECONDS` (discovery's ``liveness_seconds``), each with the message id
  discovery gives it;
* **kubelet plugin**: a trickle of ClaimPrepared and ClaimUnprepared events
  (:data:`CLAIMS_PER_NODE_HOUR` per node), which the audit service records.

Every loop spreads its work over its period in small batches, so the apiserver and NATS see
a steady rate rather than a burst each period. A node can be silenced (its heartbeats stop,
as when its discovery or the whole instance dies) and resumed.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from neuron_dra_common.bus import Publisher
from neuron_dra_common.events import (
    ClaimPrepared,
    ClaimUnprepared,
    Event,
    NodeHeartbeat,
    NodeInventory,
    ObjectRef,
)
from neuron_dra_common.kube import NODES, KubeClient
from neuron_dra_common.kube.leader import LEASES

__all__ = [
    "HEARTBEAT_SECONDS",
    "LEASE_SECONDS",
    "STATUS_SECONDS",
    "Agents",
    "FleetSim",
    "Kubelets",
    "batches",
]

Obj = dict[str, Any]

#: The kubelet's Lease renew interval (a 40 s Lease, renewed every quarter of it).
LEASE_SECONDS = 10.0
#: The kubelet's ``nodeStatusReportFrequency``: status posted this often when unchanged.
STATUS_SECONDS = 300.0
#: Discovery's default ``liveness_seconds``.
HEARTBEAT_SECONDS = 1.0
#: Claims prepared (and later released) per node per hour: a job of a few minutes per node.
CLAIMS_PER_NODE_HOUR = 12.0
#: Requests to the apiserver in flight at once (the fleet's kubelets share one client here).
WORKERS = 16
#: How many slices a period is cut into.
SLICES_PER_PERIOD = 10


def batches(
    names: Sequence[str], period: float, slices: int = SLICES_PER_PERIOD
) -> list[list[str]]:
    """``names`` cut into ``slices`` nearly equal batches, one sent every ``period / slices``.

    >>> batches(["a", "b", "c", "d", "e"], 1.0, slices=2)
    [['a', 'b', 'c'], ['d', 'e']]
    """
    size = max(1, -(-len(names) // slices))
    return [list(names[i : i + size]) for i in range(0, len(names), size)]


def _micro_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _ready_status() -> Obj:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "bench: no kubelet; the bench renews the Lease",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ]
        }
    }


class FleetSim:
    """The fleet's kubelets and agents. ``nodes``: name -> labels."""

    def __init__(
        self,
        *,
        kube: KubeClient | None,
        publisher: Publisher | None,
        nodes: dict[str, dict[str, str]],
    ):
        self._kube = kube
        self._publisher = publisher
        self.nodes = nodes
        self.names = list(nodes)
        self.silent: set[str] = set()
        #: When each node's newest heartbeat was acknowledged by the server (perf_counter).
        self.last_beat: dict[str, float] = {}
        self.beats_sent = 0
        #: Nodes registered so far (Node and Lease made).
        self.registered = 0
        #: The message ids of the claim events the server acknowledged, in order: what the
        #: audit must hold once it caught up.
        self.claim_ids: list[str] = []
        #: Failed batches by loop (each is tried again at the loop's next period).
        self.errors: dict[str, int] = {}
        self.last_error: BaseException | None = None
        self._sequence = 0
        self._instance = secrets.token_hex(4)
        self._boot = secrets.token_hex(8)
        self._tasks: list[asyncio.Task[None]] = []
        self._slots = asyncio.Semaphore(WORKERS)

    async def _bounded(self, work: Callable[[str], Awaitable[None]], names: Sequence[str]) -> None:
        async def one(name: str) -> None:
            async with self._slots:
                await work(name)

        await asyncio.gather(*(one(n) for n in names))

    def kube(self) -> KubeClient:
        if self._kube is None:
            raise RuntimeError("this fleet plays the agents only: no apiserver client")
        return self._kube

    @property
    def publisher(self) -> Publisher:
        if self._publisher is None:
            raise RuntimeError("this fleet plays the kubelets only: no bus")
        return self._publisher

    # -- kubelet ------------------------------------------------------------------------------

    async def register(self) -> dict[str, str]:
        """Create every Node (Ready) and its Lease; return name -> uid."""
        uids: dict[str, str] = {}

        async def one(name: str) -> None:
            made = await self.kube().create(
                NODES, {"metadata": {"name": name, "labels": self.nodes[name]}}
            )
            uids[name] = str(made["metadata"]["uid"])
            await self.kube().patch_status(NODES, name, _ready_status())
            await self.kube().create(
                LEASES,
                {
                    "metadata": {"name": name, "namespace": "kube-node-lease"},
                    "spec": {
                        "holderIdentity": name,
                        "leaseDurationSeconds": 40,
                        "renewTime": _micro_now(),
                    },
                },
                namespace="kube-node-lease",
            )
            self.registered += 1

        await self._bounded(one, self.names)
        return uids

    async def _renew(self, name: str) -> None:
        await self.kube().patch(
            LEASES, name, {"spec": {"renewTime": _micro_now()}}, namespace="kube-node-lease"
        )

    async def _status(self, name: str) -> None:
        await self.kube().patch_status(NODES, name, _ready_status())

    # -- discovery and the kubelet plugin -----------------------------------------------------

    async def publish_inventories(self, inventories: Sequence[NodeInventory]) -> None:
        await self.publisher.publish_many(inventories)

    async def beat(self, names: list[str]) -> None:
        now = datetime.now(UTC)
        live = [n for n in names if n not in self.silent]
        events: list[Event] = []
        ids: list[str] = []
        self._sequence += 1
        for name in live:
            events.append(
                NodeHeartbeat(
                    node=name,
                    boot_id=self._boot,
                    sequence=self._sequence,
                    sent_at=now,
                    interval_seconds=HEARTBEAT_SECONDS,
                    instance=self._instance,
                )
            )
            ids.append(f"heartbeat/{name}/{self._instance}/{self._sequence}")
        if not events:
            return
        await self.publisher.publish_many(events, msg_ids=ids)
        at = time.perf_counter()
        for name in live:
            if name not in self.silent:
                self.last_beat[name] = at
        self.beats_sent += len(events)

    async def _claims(self, names: list[str]) -> None:
        events: list[Event] = []
        for name in names:
            claim = ObjectRef(namespace="bench-scale", name=f"{name}-job", uid=secrets.token_hex(8))
            events.append(ClaimPrepared(node=name, claim=claim, devices=("neurondevice0",)))
            events.append(ClaimUnprepared(node=name, claim=claim, devices=("neurondevice0",)))
        if events:
            stored = await self.publisher.publish_many(events)
            self.claim_ids += [r.msg_id for r in stored]

    def silence(self, name: str) -> float:
        """Stop ``name``'s heartbeats; return when the server acknowledged its last one."""
        self.silent.add(name)
        return self.last_beat.get(name, time.perf_counter())

    def resume(self, name: str) -> None:
        self.silent.discard(name)

    # -- the loops ----------------------------------------------------------------------------

    def start(self, *, kubelets: bool = True, agents: bool = True) -> None:
        """Start the periodic loops: the kubelets' (after :meth:`register`), the agents'."""
        if kubelets:
            self._tasks += [
                asyncio.create_task(self._every(LEASE_SECONDS, self._lease_batch), name="leases"),
                asyncio.create_task(self._every(STATUS_SECONDS, self._status_batch), name="status"),
            ]
        if agents:
            self._tasks += [
                asyncio.create_task(self._every(HEARTBEAT_SECONDS, self.beat), name="heartbeats"),
                asyncio.create_task(self._claim_loop(), name="claims"),
            ]

    async def _lease_batch(self, names: list[str]) -> None:
        await self._bounded(self._renew, names)

    async def _status_batch(self, names: list[str]) -> None:
        await self._bounded(self._status, names)

    async def _every(self, period: float, work: Callable[[list[str]], Awaitable[None]]) -> None:
        """``work`` on every node once per ``period``, in batches spread over it; a batch
        that runs late is not made up for (as a kubelet that fell behind does not)."""
        while True:
            start = time.monotonic()
            parts = batches(self.names, period)
            for i, part in enumerate(parts):
                await self._tolerant(work, part)
                due = start + period * (i + 1) / len(parts)
                await asyncio.sleep(max(0.0, due - time.monotonic()))

    async def _tolerant(
        self, work: Callable[[list[str]], Awaitable[None]], part: list[str]
    ) -> None:
        """A failed batch is counted and the loop goes on, as a kubelet or an agent tries
        again at its next period; only the last failure of each kind is kept."""
        try:
            await work(part)
        except Exception as exc:
            self.errors[getattr(work, "__name__", "work")] = (
                self.errors.get(getattr(work, "__name__", "work"), 0) + 1
            )
            self.last_error = exc

    async def _claim_loop(self) -> None:
        per_second = len(self.names) * CLAIMS_PER_NODE_HOUR / 3600.0
        owed = 0.0
        k = 0
        while True:
            await asyncio.sleep(1.0)
            owed += per_second
            count, owed = int(owed), owed - int(owed)
            picked = [self.names[(k + i) % len(self.names)] for i in range(count)]
            k += count
            await self._tolerant(self._claims, picked)

    def failed(self) -> str:
        """The batches that failed, by loop, and the last error; empty: none."""
        if not self.errors:
            return ""
        counts = ", ".join(f"{k} {v}" for k, v in sorted(self.errors.items()))
        return f"failed batches (tried again next period): {counts}; last: {self.last_error!r}"

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


# -- the agents in a process of their own --------------------------------------------------------


class Agents:
    """The fleet's agents (heartbeats, claim events) in a child process (``python -m
    bench.fleetsim``), so that the bench's own work (publishing every inventory, watching
    every slice) never delays a heartbeat, as it would not on real nodes. Commands go to its
    stdin and answers come back on its stdout, one line each."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc
        self._lock = asyncio.Lock()

    @property
    def pid(self) -> int:
        return self._proc.pid

    @classmethod
    async def start(cls, urls: Sequence[str], names: Sequence[str]) -> Agents:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.fleetsim",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        agents = cls(proc)
        answer = await agents._ask({"urls": list(urls), "names": list(names)})
        if answer.get("ready") is not True:
            raise RuntimeError(f"the simulated agents did not start: {answer}")
        return agents

    async def _ask(self, command: dict[str, Any]) -> dict[str, Any]:
        assert self._proc.stdin is not None
        assert self._proc.stdout is not None
        async with self._lock:
            self._proc.stdin.write(json.dumps(command).encode() + b"\n")
            await self._proc.stdin.drain()
            line = await asyncio.wait_for(self._proc.stdout.readline(), 120.0)
        if not line:
            raise RuntimeError("the simulated agents' process exited")
        answer: dict[str, Any] = json.loads(line)
        return answer

    async def silence(self, name: str) -> float:
        """Stop ``name``'s heartbeats; when the server acknowledged its last one (the
        machine's monotonic clock, as ``time.perf_counter`` reads it here)."""
        return float((await self._ask({"silence": name}))["acked"])

    async def resume(self, name: str) -> None:
        await self._ask({"resume": name})

    async def claim_ids(self) -> list[str]:
        """The message ids of every claim event the server acknowledged so far."""
        return [str(i) for i in (await self._ask({"claims": True}))["ids"]]

    async def stats(self) -> tuple[int, str]:
        """Heartbeats sent so far, and the failed batches (empty: none)."""
        answer = await self._ask({"stats": True})
        return int(answer["beats"]), str(answer["failed"])

    async def stop(self) -> None:
        if self._proc.returncode is None:
            self._proc.terminate()
            await self._proc.wait()


class Kubelets:
    """The fleet's kubelets alone (Nodes registered Ready, Leases renewed, status posted) in
    a child process, for a bench that measures something else in its own process: the
    renewals neither take its CPU time nor wait for it."""

    def __init__(self, proc: subprocess.Popen[bytes], uids: dict[str, str]) -> None:
        self._proc = proc
        #: name -> the Node's uid
        self.uids = uids

    @classmethod
    def start(cls, kubeconfig: str, nodes: dict[str, dict[str, str]]) -> Kubelets:
        """Register every node (name -> labels) and keep them Ready until :meth:`stop`."""
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.fleetsim"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert proc.stdin is not None
        assert proc.stdout is not None
        proc.stdin.write(json.dumps({"kubeconfig": kubeconfig, "nodes": nodes}).encode() + b"\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        answer = json.loads(line) if line else {}
        if answer.get("ready") is not True:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"the simulated kubelets did not start: {answer or 'exited'}")
        return cls(proc, {str(k): str(v) for k, v in answer["uids"].items()})

    def stop(self) -> str:
        """Stop renewing; the batches that failed meanwhile (empty: none)."""
        assert self._proc.stdin is not None
        assert self._proc.stdout is not None
        failed = ""
        if self._proc.poll() is None:
            self._proc.stdin.write(b'{"stats": true}\n')
            self._proc.stdin.flush()
            line = self._proc.stdout.readline()
            failed = str(json.loads(line).get("failed", "")) if line else "exited early"
            self._proc.terminate()
        self._proc.wait()
        return failed


_SPEC_LINE_LIMIT = 16 << 20


async def _serve_kubelets(spec: dict[str, Any], reader: asyncio.StreamReader) -> None:
    from neuron_dra_common.kube import connect

    kube = await connect(kubeconfig=spec["kubeconfig"])
    fleet = FleetSim(kube=kube, publisher=None, nodes=spec["nodes"])
    try:
        uids = await fleet.register()
        fleet.start(agents=False)
        sys.stdout.write(json.dumps({"ready": True, "uids": uids}) + "\n")
        sys.stdout.flush()
        while await reader.readline():
            sys.stdout.write(json.dumps({"failed": fleet.failed()}) + "\n")
            sys.stdout.flush()
    finally:
        await fleet.stop()
        await kube.close()


async def _serve() -> None:
    from neuron_dra_common.bus import Bus

    loop = asyncio.get_running_loop()
    # The first line names every node: about 40 bytes a node, so 10,000 nodes need more than
    # the reader's default 64 KiB a line.
    reader = asyncio.StreamReader(limit=_SPEC_LINE_LIMIT)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    spec = json.loads(await reader.readline())
    if "kubeconfig" in spec:
        await _serve_kubelets(spec, reader)
        return
    bus = await Bus.connect(spec["urls"], name="bench-scale-agents")
    fleet = FleetSim(
        kube=None,
        publisher=bus.publisher(source="/bench/scale"),
        nodes={name: {} for name in spec["names"]},
    )
    fleet.start(kubelets=False)

    def say(answer: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()

    say({"ready": True})
    try:
        while line := await reader.readline():
            command = json.loads(line)
            if "silence" in command:
                say({"acked": fleet.silence(command["silence"])})
            elif "claims" in command:
                say({"ids": fleet.claim_ids})
            elif "resume" in command:
                fleet.resume(command["resume"])
                say({"resumed": True})
            else:
                say({"beats": fleet.beats_sent, "failed": fleet.failed()})
    finally:
        await fleet.stop()
        await bus.close()


if __name__ == "__main__":
    asyncio.run(_serve())
