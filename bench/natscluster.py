"""A three-server NATS JetStream cluster on loopback, configured as the eks overlay configures
its StatefulSet (``deploy/kustomize/overlays/eks/nats.conf``).

The overlay's file is used as it is, with only what a pod gets from Kubernetes replaced by
local equivalents: the server name (``$POD_NAME``), the addresses (the pod's 4222, 8222 and
6222 become free loopback ports), the routes (the headless Service's names become those
ports), and the store (``/data``, the PersistentVolume, becomes a directory of the run). Its
``include ./cluster-tls.conf`` reads an empty file beside it: the routes speak in clear, as
the overlay's own comment says they do until the bus-auth component replaces that file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from neuron_dra_cli.stack import process
from neuron_dra_cli.stack.components import venv_binary
from neuron_dra_common.bus import STREAMS, Bus
from neuron_dra_common.bus.declarations import CONSUMERS

from bench.stack import REPO

__all__ = [
    "OVERLAY_CONF",
    "NatsCluster",
    "lead_from",
    "nats_cluster",
    "server_config",
    "stream_leaders",
]

OVERLAY_CONF = REPO / "deploy" / "kustomize" / "overlays" / "eks" / "nats.conf"
SIZE = 3
READY_WITHIN = 60.0


@dataclass
class NatsServer:
    name: str
    client: int
    monitor: int
    route: int
    store: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.client}"


@dataclass
class NatsCluster:
    servers: list[NatsServer]

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    @property
    def pids(self) -> dict[str, int]:
        return {s.name: s.proc.pid for s in self.servers if s.proc is not None}

    def server(self, name: str) -> NatsServer:
        for s in self.servers:
            if s.name == name:
                return s
        raise KeyError(f"no NATS server {name!r}; the cluster has {[s.name for s in self.servers]}")

    def kill(self, name: str) -> None:
        """SIGKILL ``name``, as the kernel's OOM killer or a lost instance stops it."""
        proc = self.server(name).proc
        if proc is not None:
            proc.kill()
            proc.wait(10)

    def restart(self, name: str) -> None:
        """Start ``name`` again on its ports and store, as its StatefulSet restarts the pod."""
        _spawn(self.server(name))

    def store_bytes(self) -> dict[str, int]:
        """Bytes each server's JetStream store holds on disk now."""
        return {
            s.name: sum(f.stat().st_size for f in s.store.rglob("*") if f.is_file())
            for s in self.servers
        }


def server_config(text: str, server: NatsServer, routes: list[int]) -> str:
    """The overlay's ``nats.conf`` for ``server`` on loopback (see the module's docstring)."""
    replaced = {
        r"server_name: \$POD_NAME": f"server_name: {server.name}",
        r"listen: 0\.0\.0\.0:4222": f"listen: 127.0.0.1:{server.client}",
        r"http: 127\.0\.0\.1:8222": f"http: 127.0.0.1:{server.monitor}",
        r"store_dir: /data": f'store_dir: "{server.store}"',
        r"listen: 0\.0\.0\.0:6222": f"listen: 127.0.0.1:{server.route}",
    }
    for pattern, value in replaced.items():
        text, count = re.subn(pattern, value, text)
        if count != 1:
            raise ValueError(f"{OVERLAY_CONF}: expected one '{pattern}', found {count}")
    local = "\n".join(f"    nats://127.0.0.1:{port}" for port in routes)
    text, count = re.subn(
        r"routes: \[\n(?:\s*nats://[^\n]+\n)+\s*\]", f"routes: [\n{local}\n  ]", text
    )
    if count != 1:
        raise ValueError(f"{OVERLAY_CONF}: expected one routes list, found {count}")
    return text


def _healthy(server: NatsServer) -> bool:
    """Healthy, and JetStream's meta group has a leader (a stream of three copies can be
    made)."""
    base = f"http://127.0.0.1:{server.monitor}"
    try:
        with urllib.request.urlopen(f"{base}/healthz", timeout=2) as answer:
            if answer.status != 200:
                return False
        with urllib.request.urlopen(f"{base}/jsz", timeout=2) as answer:
            meta = json.loads(answer.read()).get("meta_cluster") or {}
            return bool(meta.get("leader")) and int(meta.get("cluster_size") or 0) == SIZE
    except (OSError, ValueError):
        return False


def _spawn(server: NatsServer) -> None:
    folder = server.store.parent
    with (folder / "nats.log").open("ab") as log:
        server.proc = subprocess.Popen(
            [str(venv_binary("nats-server")), "--config", str(folder / "nats.conf")],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=os.environ.copy(),
        )


@contextmanager
def nats_cluster(root: Path) -> Iterator[NatsCluster]:
    """Three servers under ``root``, each healthy (JetStream's meta group formed)."""
    text = OVERLAY_CONF.read_text()
    servers = [
        NatsServer(
            name=f"nats-{i}",
            client=process.free_port(),
            monitor=process.free_port(),
            route=process.free_port(),
            store=root / f"nats-{i}" / "data",
        )
        for i in range(SIZE)
    ]
    cluster = NatsCluster(servers)
    try:
        for server in servers:
            folder = server.store.parent
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "cluster-tls.conf").write_text("")
            conf = folder / "nats.conf"
            conf.write_text(server_config(text, server, [s.route for s in servers]))
            _spawn(server)
        deadline = time.monotonic() + READY_WITHIN
        while not all(_healthy(s) for s in servers):
            for s in servers:
                if s.proc is not None and s.proc.poll() is not None:
                    raise RuntimeError(
                        f"NATS server {s.name} exited; its log "
                        f"{s.store.parent / 'nats.log'}:\n"
                        f"{process.tail(s.store.parent / 'nats.log', lines=20)}"
                    )
            if time.monotonic() > deadline:
                raise RuntimeError(f"the NATS cluster was not healthy within {READY_WITHIN} s")
            time.sleep(0.2)
        yield cluster
    finally:
        for s in servers:
            if s.proc is not None:
                s.proc.terminate()
        for s in servers:
            if s.proc is not None:
                try:
                    s.proc.wait(15)
                except subprocess.TimeoutExpired:
                    s.proc.kill()
                    s.proc.wait(10)


# --- who leads what ------------------------------------------------------------------------------


async def stream_leaders(bus: Bus) -> dict[str, str]:
    """Which server leads each stream and each durable consumer of the product (JetStream's
    cluster info); one without a leader (an election under way) is left out."""
    leaders: dict[str, str] = {}
    for spec in STREAMS:
        with contextlib.suppress(Exception):  # no leader to answer: an election under way
            info = await bus.js.stream_info(spec.name)
            if info.cluster is not None and info.cluster.leader:
                leaders[spec.name] = info.cluster.leader
    for durable, declared in CONSUMERS.items():
        with contextlib.suppress(Exception):  # a consumer of a service not run here
            cinfo = await bus.js.consumer_info(declared.stream, durable)
            if cinfo.cluster is not None and cinfo.cluster.leader:
                leaders[durable] = cinfo.cluster.leader
    return leaders


async def lead_from(bus: Bus, server: str, consumers: list[str]) -> None:
    """Make ``server`` the leader of every stream and of ``consumers`` (JetStream's leader
    step-down with a preferred server), so killing it takes every leader at once."""
    for spec in STREAMS:
        await _step_down(bus, f"$JS.API.STREAM.LEADER.STEPDOWN.{spec.name}", server)
    for durable in consumers:
        stream = CONSUMERS[durable].stream
        await _step_down(bus, f"$JS.API.CONSUMER.LEADER.STEPDOWN.{stream}.{durable}", server)
    leaders: dict[str, str] = {}
    for _ in range(200):
        leaders = await stream_leaders(bus)
        if all(leaders.get(name) == server for name in [*(s.name for s in STREAMS), *consumers]):
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{server} does not lead everything after the step-downs: {leaders}")


async def _step_down(bus: Bus, subject: str, server: str) -> None:
    request = json.dumps({"placement": {"preferred": server}}).encode()
    answer = json.loads((await bus.nc.request(subject, request, timeout=5)).data)
    error = answer.get("error", {})
    if not answer.get("success") and error.get("err_code") != 10005:  # 10005: already leader
        raise RuntimeError(f"{subject}: {answer}")
