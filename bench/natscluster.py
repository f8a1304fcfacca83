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

from bench.stack import REPO

__all__ = ["OVERLAY_CONF", "NatsCluster", "nats_cluster", "server_config"]

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


@contextmanager
def nats_cluster(root: Path) -> Iterator[NatsCluster]:
    """Three servers under ``root``, each healthy (JetStream's meta group formed)."""
    text = OVERLAY_CONF.read_text()
    binary = venv_binary("nats-server")
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
            log = (folder / "nats.log").open("wb")
            server.proc = subprocess.Popen(
                [str(binary), "--config", str(conf)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=os.environ.copy(),
            )
            log.close()
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
