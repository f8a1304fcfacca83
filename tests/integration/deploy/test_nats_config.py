"""The NATS configuration each overlay installs is one the pinned nats-server accepts."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from neuron_dra_bus_auth import keys
from neuron_dra_cli.stack.pki import Pki
from neuron_dra_cli.stack.process import free_port

from tests.fixtures.nats import nats_binary
from tests.unit.deploy.test_bus_auth_component import with_bus_auth
from tests.unit.deploy.test_kustomize import KUSTOMIZE, by_kind, render


def _secret_files(
    pod: dict[str, Any], container: dict[str, Any], folder: Path, pki: Pki
) -> dict[str, str]:
    """The files the StatefulSet mounts from Secrets, made here (NATS's certificate and key
    and the CA that signed them, from ``pki``): each mount path, and the folder under
    ``folder`` that stands for it."""
    cert = pki.nats()
    made = {
        "tls.crt": cert.cert.read_bytes(),
        "tls.key": cert.key.read_bytes(),
        "ca.crt": pki.ca.cert.read_bytes(),
    }
    volumes = {v["name"]: v for v in pod.get("volumes", ())}
    moved: dict[str, str] = {}
    for mount in container.get("volumeMounts", ()):
        secret = volumes.get(mount["name"], {}).get("secret")
        if secret is None:
            continue
        there = folder / mount["name"]
        there.mkdir(exist_ok=True)
        for item in secret["items"]:
            (there / item["path"]).write_bytes(made[item["key"]])
        moved[mount["mountPath"]] = str(there)
    return moved


def _write_config(
    docs: list[dict[str, Any]],
    folder: Path,
    env: dict[str, str],
    *,
    pki: Pki | None = None,
    replace: dict[str, str] | None = None,
) -> Path:
    """The rendered config files in ``folder``, as the StatefulSet starts the server: the
    files it mounts from Secrets where the config names them, and each of ``replace``'s
    texts replaced (addresses of a test's own). Returns the file the server is started with."""
    [config] = [c for n, c in by_kind(docs, "ConfigMap").items() if n.startswith("nats-config")]
    pod = by_kind(docs, "StatefulSet")["nats"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    moved = _secret_files(pod, container, folder, pki or Pki(folder / "pki"))
    for name, text in config["data"].items():
        for mount_path, there in moved.items():
            text = text.replace(f"{mount_path}/", f"{there}/")
        for was, now in (replace or {}).items():
            text = text.replace(was, now)
        (folder / name).write_text(text)
    assert container["args"][0] == "--config"
    assert container["args"][1].startswith("/etc/nats/")
    assert {e["name"] for e in container["env"]} == {"POD_NAME", *env}
    return folder / Path(container["args"][1]).name


def _check(
    docs: list[dict[str, Any]], folder: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """``nats-server -t`` on the rendered config files."""
    return subprocess.run(
        [str(nats_binary()), "-c", str(_write_config(docs, folder, env)), "-t"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "POD_NAME": "nats-0", **env},
    )


def _keys_env() -> dict[str, str]:
    """What the StatefulSet reads from the Secret neuron-dra-bus-auth, freshly made."""
    made = keys.new_keys()
    return {
        "NEURON_DRA_BUS_AUTH_ISSUER": made.public_key,
        "NEURON_DRA_BUS_AUTH_PASSWORD": made.password,
    }


@pytest.mark.parametrize("tree", ["base", "overlays/eks", "overlays/local"])
def test_nats_server_accepts_the_rendered_configuration(tree: str, tmp_path: Path) -> None:
    proc = _check(render(KUSTOMIZE / tree), tmp_path, _keys_env())
    assert proc.returncode == 0, proc.stderr
    assert "is valid" in proc.stderr + proc.stdout


def _outside_addresses() -> list[str]:
    """Addresses of this host other than 127.0.0.1: another loopback address, and the one of
    the interface a packet outwards would leave by, if there is one."""
    found = ["127.0.0.2"]
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("10.255.255.255", 1))  # no packet is sent: only a route is chosen
        found.append(s.getsockname()[0])
    return found


def test_the_monitoring_port_answers_inside_the_pod_only(tmp_path: Path) -> None:
    """The base's server, started from its rendered files: /healthz (the probes, run inside
    the container) answers on the loopback, and nothing answers at another address."""
    monitor = free_port()
    replace = {
        "0.0.0.0:4222": f"127.0.0.1:{free_port()}",
        "127.0.0.1:8222": f"127.0.0.1:{monitor}",
        "store_dir: /data": f"store_dir: {tmp_path / 'data'}",
    }
    env = _keys_env()
    config = _write_config(render(KUSTOMIZE / "base"), tmp_path, env, replace=replace)
    assert "http: 127.0.0.1:" in config.with_name("nats.conf").read_text()
    with (tmp_path / "server.log").open("wb") as out:
        proc = subprocess.Popen(
            [str(nats_binary()), "-c", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "POD_NAME": "nats-0", **env},
        )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{monitor}/healthz", timeout=2) as r:
                    assert r.status == 200
                    break
            except OSError:
                assert proc.poll() is None, (tmp_path / "server.log").read_text()
                assert time.monotonic() < deadline, (tmp_path / "server.log").read_text()
                time.sleep(0.2)
        for address in _outside_addresses():
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection((address, monitor), timeout=2).close()
    finally:
        proc.terminate()
        proc.wait(20)


@pytest.mark.parametrize("tree", ["base", "overlays/eks"])
def test_nats_server_accepts_the_auth_callout_with_the_secrets_keys(
    tree: str, tmp_path: Path
) -> None:
    (tmp_path / "overlay").mkdir()
    docs = with_bus_auth(tmp_path / "overlay", tree)
    made = keys.new_keys()
    env = {
        "NEURON_DRA_BUS_AUTH_ISSUER": made.public_key,
        "NEURON_DRA_BUS_AUTH_PASSWORD": made.password,
    }
    proc = _check(docs, tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    assert "is valid" in proc.stderr + proc.stdout
    # The server checks the issuer: a Secret with a wrong key stops it, naming the field.
    proc = _check(docs, tmp_path, {**env, "NEURON_DRA_BUS_AUTH_ISSUER": made.seed})
    assert proc.returncode != 0
    assert "public account nkey" in proc.stderr


_ROUTE = "nats://nats-{}.nats-cluster.neuron-dra-driver.svc:6222"


class _Cluster:
    """The servers of the eks overlay's NATS cluster with the bus-auth component, started
    from the rendered files on addresses of this host; their logs are kept."""

    def __init__(self, docs: list[dict[str, Any]], folder: Path, env: dict[str, str]) -> None:
        self.docs, self.folder, self.env = docs, folder, env
        self.routes = [free_port() for _ in range(3)]
        self.monitors: dict[str, int] = {}
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, pki: Pki, *, route_tls: bool = True) -> Path:
        """Server ``name`` (nats-0 to nats-2 are the cluster's; another name is a stranger
        that routes to them) with ``pki``'s certificate; without ``route_tls`` its routes are
        in clear. Returns its log."""
        here = self.folder / name
        here.mkdir()
        index = int(name.rsplit("-", 1)[1])
        route = self.routes[index] if index < 3 else free_port()
        self.monitors[name] = free_port()
        replace = {
            "0.0.0.0:4222": f"127.0.0.1:{free_port()}",
            "127.0.0.1:8222": f"127.0.0.1:{self.monitors[name]}",
            "0.0.0.0:6222": f"127.0.0.1:{route}",
            "store_dir: /data": f"store_dir: {here / 'data'}",
            **{_ROUTE.format(i): f"nats://127.0.0.1:{port}" for i, port in enumerate(self.routes)},
        }
        config = _write_config(self.docs, here, self.env, pki=pki, replace=replace)
        if not route_tls:
            (here / "cluster-tls.conf").write_text("# routes in clear\n")
        log = here / "server.log"
        with log.open("wb") as out:
            self.procs.append(
                subprocess.Popen(
                    [str(nats_binary()), "-c", str(config)],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, "POD_NAME": name, **self.env},
                )
            )
        return log

    def monitor(self, name: str, endpoint: str) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.monitors[name]}/{endpoint}"
        with urllib.request.urlopen(url, timeout=5) as reply:
            found: dict[str, Any] = json.loads(reply.read())
        return found

    def peers(self, name: str) -> set[str]:
        """The servers ``name`` has routes with (a pool of several to each)."""
        return {r["remote_name"] for r in self.monitor(name, "routez").get("routes", ())}

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _until(what: str, check: Callable[[], bool], timeout: float = 30) -> None:
    """Waits for ``check`` (a server not answering yet counts as not yet)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {what}")
        time.sleep(0.2)


def test_the_eks_cluster_routes_speak_tls_and_refuse_a_server_without_the_cas_certificate(
    tmp_path: Path,
) -> None:
    (tmp_path / "overlay").mkdir()
    docs = with_bus_auth(tmp_path / "overlay", "overlays/eks")
    made = keys.new_keys()
    env = {
        "NEURON_DRA_BUS_AUTH_ISSUER": made.public_key,
        "NEURON_DRA_BUS_AUTH_PASSWORD": made.password,
    }
    cluster = _Cluster(docs, tmp_path / "servers", env)
    (tmp_path / "servers").mkdir()
    ours = Pki(tmp_path / "pki")
    try:
        logs = {name: cluster.start(name, ours) for name in ("nats-0", "nats-1", "nats-2")}
        names = set(logs)
        _until(
            "each server routes to the other two",
            lambda: all(cluster.peers(name) == names - {name} for name in names),
        )
        for name in names:
            routes = cluster.monitor(name, "varz")["cluster"]
            assert (routes.get("tls_required"), routes.get("tls_verify")) == (True, True), routes
        # JetStream's cluster formed over those routes: three servers, one meta leader.
        _until(
            "a JetStream meta leader",
            lambda: bool(cluster.monitor("nats-0", "jsz")["meta_cluster"].get("leader")),
        )
        assert cluster.monitor("nats-0", "jsz")["meta_cluster"]["cluster_size"] == 3

        # A server whose certificate another CA signed is refused, as is one in clear.
        strangers = {
            "nats-3": cluster.start("nats-3", Pki(tmp_path / "other-pki")),
            "nats-4": cluster.start("nats-4", ours, route_tls=False),
        }
        _until(
            "nats-0 refuses both",
            lambda: all(
                refusal in logs["nats-0"].read_text()
                for refusal in (
                    "TLS route handshake error: remote error: tls: bad certificate",
                    "TLS route handshake error: tls: first record does not look like a TLS",
                )
            ),
        )
        assert "certificate signed by unknown authority" in strangers["nats-3"].read_text()
        for name in names:
            assert cluster.peers(name) == names - {name}
        for name in strangers:
            assert cluster.peers(name) == set()
    finally:
        cluster.stop()
