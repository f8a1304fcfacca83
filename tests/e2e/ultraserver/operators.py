"""Start, kill and watch UltraServer operator processes on the local stack.

The stack starts one operator (component ``ultraserver-operator``). Tests replace it with
their own processes, run the same way (``python -m neuron_dra_ultraserver_operator`` with the
stack's NATS and kubeconfig); each one is recorded in the stack's state so ``dev down``
stops whatever a failed test left running. ``restore`` leaves one normal operator under the
stack's name, as the other tests expect.
"""

from __future__ import annotations

import os
import signal
import subprocess
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from neuron_dra_cli.stack import process, state
from neuron_dra_cli.stack.components import python_service
from neuron_dra_cli.stack.layout import Layout
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures.processes import start_recorded, wait_gone
from tests.fixtures.stack import KubeStack

STACK_NAME = "ultraserver-operator"
KIND = "ultraserver-operator"
LEASE = "neuron-dra-ultraserver-operator"

#: Operators left running for the rest of the session (``dev down`` stops them); held here so
#: their handles are not collected while the process still runs.
_LEFT_RUNNING: list[subprocess.Popen[bytes]] = []


@dataclass
class Operators:
    stack: KubeStack
    layout: Layout
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    special: set[str] = field(default_factory=set)  # started with extra settings

    @classmethod
    def of(cls, stack: KubeStack) -> Operators:
        return cls(stack=stack, layout=Layout(stack.state_dir))

    def _recorded(self, name: str) -> state.ComponentState | None:
        current = state.load(self.layout.root)
        return next((c for c in current.components if c.name == name), None) if current else None

    def pid(self, name: str) -> int | None:
        proc = self.procs.get(name)
        if proc is not None:
            return proc.pid if proc.poll() is None else None
        c = self._recorded(name)
        if c is not None and process.alive(process.Running(pid=c.pid, start_ticks=c.start_ticks)):
            return int(c.pid)
        return None

    def log(self, name: str) -> Path:
        return Path(self.layout.log(name))

    def stop(self, name: str, sig: signal.Signals = signal.SIGTERM) -> None:
        """Stop ``name`` (SIGTERM: cleanly, handing the Lease back; SIGKILL: dead)."""
        pid = self.pid(name)
        if pid is not None:
            os.kill(pid, sig)
            wait_gone(pid, timeout=30)
        proc = self.procs.pop(name, None)
        if proc is not None:
            proc.wait(timeout=10)

    def start(self, name: str, *, env: dict[str, str] | None = None) -> None:
        """Start an operator recorded as ``name`` (the old one of that name must be gone)."""
        assert self.pid(name) is None, f"{name} is still running"
        c = python_service(
            name=name,
            kind=KIND,
            module="neuron_dra_ultraserver_operator",
            env={
                **self.stack.service_env(),
                "NEURON_DRA_KUBECONFIG": str(self.stack.kubeconfig),
                **(env or {}),
            },
        )
        proc = start_recorded(self.layout, c, log=self.log(name))
        self.procs[name] = proc
        self.ports[name] = c.ports["http"]
        if env:
            self.special.add(name)
        else:
            self.special.discard(name)

    def wait_exited(self, name: str, *, timeout: float = 60) -> int:
        """Wait for ``name`` (started here) to exit; its exit status."""
        proc = self.procs.pop(name)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            tail = self.log(name).read_text().splitlines()[-20:]
            raise AssertionError(f"{name} still running:\n" + "\n".join(tail)) from None

    def wait_ready(self, name: str, *, timeout: float = 60) -> None:
        proc = self.procs[name]

        def ready() -> bool:
            if proc.poll() is not None:
                tail = self.log(name).read_text().splitlines()[-20:]
                raise AssertionError(f"{name} exited ({proc.returncode}):\n" + "\n".join(tail))
            return _get(f"http://127.0.0.1:{self.ports[name]}/readyz") == 200

        self.stack.wait_for(f"{name} ready", ready, timeout=timeout)

    def metrics(self, name: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """``name``'s Prometheus samples: (sample name, sorted labels) -> value."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ports[name]}/metrics") as resp:
            text = resp.read().decode()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def writes(self, name: str) -> dict[str, float]:
        """Requests that change something, by ``METHOD resource``, Leases left out."""
        return {
            f"{labels['method']} {labels['resource']}": value
            for (sample, raw), value in self.metrics(name).items()
            if sample == "neuron_dra_kube_requests_total"
            and (labels := dict(raw))["method"] not in ("GET", "WATCH")
            and labels["resource"] != "leases"
            and value
        }

    def holder(self) -> str:
        lease = self.stack.get_json("lease", LEASE, "-n", "neuron-dra-driver")
        return str(lease["spec"].get("holderIdentity") or "")

    def restore(self) -> None:
        """Whatever runs, leave exactly one normal operator, under the stack's name."""
        for name in list(self.procs):
            if name != STACK_NAME or name in self.special:
                self.stop(name, signal.SIGKILL)
        if self.pid(STACK_NAME) is None:
            self.start(STACK_NAME)
            self.wait_ready(STACK_NAME)
        if STACK_NAME in self.procs:
            _LEFT_RUNNING.append(self.procs.pop(STACK_NAME))


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status)
    except OSError:
        return 0
