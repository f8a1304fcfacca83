"""A bare control plane for a benchmark: etcd and kube-apiserver from the cached Kubernetes
build, no kubelet and no controller-manager, and the components a scenario starts against it
(a kube-scheduler, a neuron-dra service), each stopped when the scenario is done with it and
all of them on the way out, even on Ctrl-C or SIGTERM."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from neuron_dra_cli import kubebuild
from neuron_dra_cli.stack import components, process
from neuron_dra_cli.stack.pki import Pki, write_kubeconfig

__all__ = ["ControlPlane", "control_plane"]

#: On a busy machine an apiserver takes minutes to say it is ready.
READY_WITHIN = 300.0


@dataclass
class ControlPlane:
    """The running etcd and kube-apiserver; ``admin`` is a kubeconfig of ``system:masters``."""

    root: Path
    binaries: kubebuild.KubeBinaries
    pki: Pki
    server: str
    admin: Path
    _running: list[tuple[str, process.Running]] = field(default_factory=list)

    def kubeconfig(self, stem: str, *, user: str, groups: tuple[str, ...] = ()) -> Path:
        """A kubeconfig for ``user`` (a client certificate of this control plane's CA)."""
        return write_kubeconfig(
            self.root / f"{stem}.kubeconfig",
            server=self.server,
            ca=self.pki.ca.cert,
            pair=self.pki.client(stem, user=user, groups=groups),
            user=user,
        )

    def start(self, component: components.Component) -> process.Running:
        """Start ``component`` (log under ``root``) and return once it says it is ready."""
        log = self.root / f"{component.name}.log"
        running = process.start(component.argv, log_path=log, env=component.env)
        self._running.append((component.name, running))
        deadline = time.monotonic() + READY_WITHIN
        while not component.ready():
            if not process.alive(running):
                raise RuntimeError(
                    f"{component.name} exited while starting; its log {log}:\n"
                    f"{process.tail(log, lines=30)}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{component.name} not ready within {READY_WITHIN:.0f} s; its log {log}:\n"
                    f"{process.tail(log, lines=30)}"
                )
            time.sleep(0.2)
        return running

    def pids(self) -> dict[str, int]:
        """Every component still running, by name."""
        return {name: running.pid for name, running in self._running}

    def stop(self, running: process.Running) -> None:
        """SIGTERM (then SIGKILL) one component this control plane started."""
        process.stop([running])
        self._running = [(n, r) for n, r in self._running if r != running]

    def stop_all(self) -> None:
        """Stop every component still running, the newest first."""
        for _name, running in reversed(self._running):
            process.stop([running])
        self._running = []


@contextlib.contextmanager
def control_plane(root: Path) -> Iterator[ControlPlane]:
    """etcd and kube-apiserver under ``root`` on free ports; everything started through the
    yielded :class:`ControlPlane` is stopped on the way out, newest first."""
    binaries = kubebuild.ensure_binaries(progress=lambda _message: None)
    pki = Pki(root / "pki")
    admin_pair = pki.client("admin", user="kubernetes-admin", groups=("system:masters",))
    etcd_port, peer_port, api_port = (process.free_port() for _ in range(3))
    server = f"https://127.0.0.1:{api_port}"
    admin = write_kubeconfig(
        root / "admin.kubeconfig",
        server=server,
        ca=pki.ca.cert,
        pair=admin_pair,
        user="kubernetes-admin",
    )
    plane = ControlPlane(root=root, binaries=binaries, pki=pki, server=server, admin=admin)

    def interrupted(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupted)
    try:
        plane.start(
            components.etcd(
                binary=binaries.etcd, state_dir=root, port=etcd_port, peer_port=peer_port
            )
        )
        plane.start(
            components.apiserver(
                binary=binaries.kube_apiserver,
                pki=pki,
                etcd_port=etcd_port,
                port=api_port,
                admin=admin_pair,
            )
        )
        yield plane
    finally:
        # A second Ctrl-C must not cut the tear-down short and leave processes running.
        old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            plane.stop_all()
        finally:
            signal.signal(signal.SIGINT, old_int)
            signal.signal(signal.SIGTERM, previous)
