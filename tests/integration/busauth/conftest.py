"""A real nats-server whose clients are admitted by the real ``neuron-dra-bus-auth`` process,
which asks the local stack's real apiserver about their ServiceAccount tokens."""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from neuron_dra_bus_auth.identities import service_account_of
from neuron_dra_bus_auth.natsjwt import Signer, new_account_seed
from neuron_dra_bus_auth.permissions import ROLES

from tests.fixtures.nats import NatsServer, auth_callout_config, free_port
from tests.fixtures.stack import KubeStack

CALLOUT_USER = "neuron-dra-bus-auth"


@dataclass
class AuthenticatedBus:
    """The server, the callout's log, and a way to get any identity's token."""

    server: NatsServer
    callout_log: Path
    stack: KubeStack
    namespace: str
    tokens: Path

    @property
    def url(self) -> str:
        return self.server.url

    def token_file(self, service_account: str, *, pod: str = "") -> Path:
        """A fresh token of ``service_account``, bound to ``pod`` when given (then it carries
        the pod's node, as a projected token in that pod does)."""
        args = ["create", "token", service_account, "-n", self.namespace, "--duration=1h"]
        if pod:
            args += ["--bound-object-kind=Pod", f"--bound-object-name={pod}"]
        token = self.stack.kubectl(*args).stdout.strip()
        path = self.tokens / f"{service_account}-{pod or 'unbound'}-{uuid.uuid4().hex[:6]}"
        path.write_text(token)
        return path

    def pod_on(self, node: str, *, service_account: str) -> str:
        """A pod of ``service_account`` bound to ``node`` (it need not run: its binding is
        what the token records)."""
        name = f"agent-{uuid.uuid4().hex[:8]}"
        manifest = f"""
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {self.namespace}}}
spec:
  nodeName: {node}
  serviceAccountName: {service_account}
  containers: [{{name: agent, image: registry.invalid/agent:0}}]
"""
        self.stack.kubectl("apply", "-f", "-", input=manifest)
        return name

    @contextlib.contextmanager
    def service(
        self,
        module: str,
        *,
        token: Path,
        log: Path,
        env: dict[str, str] | None = None,
        wait_ready: bool = True,
    ) -> Iterator[int]:
        """Run ``python -m module`` with ``token`` as its NATS token until it is ready (at
        once without ``wait_ready``: one the server refuses never is); yields its HTTP port,
        stops it after."""
        port = free_port()
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", module],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={
                    **os.environ,
                    "NEURON_DRA_NATS_SERVERS": self.url,
                    "NEURON_DRA_NATS_TOKEN_FILE": str(token),
                    # This server has the callout but no TLS.
                    "NEURON_DRA_INSECURE_BUS": "1",
                    "NEURON_DRA_HTTP_HOST": "127.0.0.1",
                    "NEURON_DRA_HTTP_PORT": str(port),
                    **(env or {}),
                },
            )
        try:
            if wait_ready:
                _wait_ready(port, proc, log)
            yield port
        finally:
            _stop(proc)

    def callout_says(self, text: str, *, timeout: float = 30) -> str:
        """The callout log's line containing ``text``, waited for."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.callout_log.read_text(errors="replace").splitlines():
                if text in line:
                    return line
            time.sleep(0.1)
        raise AssertionError(
            f"the callout never logged {text!r}; log:\n"
            + self.callout_log.read_text(errors="replace")[-3000:]
        )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _wait_ready(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited {proc.returncode}: {log.read_text()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{proc.args!r} not ready in {timeout} s: {log.read_text()}")


@pytest.fixture
def authenticated_bus(kube_stack: KubeStack, tmp_path: Path) -> Iterator[AuthenticatedBus]:
    namespace = f"busauth-{uuid.uuid4().hex[:6]}"
    kube_stack.create_namespace(namespace)
    for role in ROLES:
        kube_stack.kubectl("create", "serviceaccount", service_account_of(role), "-n", namespace)
    seed = new_account_seed()
    (tmp_path / "issuer.nk").write_bytes(seed)
    password = secrets.token_hex(16)
    (tmp_path / "password").write_text(password)
    config = tmp_path / "nats.conf"
    config.write_text(
        auth_callout_config(issuer=Signer(seed).public_key, user=CALLOUT_USER, password=password)
    )
    store = tmp_path / "jetstream"
    store.mkdir()
    server = NatsServer(store_dir=store, log_file=tmp_path / "nats-server.log", config=config)
    server.start()
    log = tmp_path / "bus-auth.log"
    http_port = free_port()
    env = {
        **os.environ,
        "NEURON_DRA_NATS_SERVERS": server.url,
        "NEURON_DRA_ISSUER_SEED_FILE": str(tmp_path / "issuer.nk"),
        "NEURON_DRA_NATS_PASSWORD_FILE": str(tmp_path / "password"),
        "NEURON_DRA_INSECURE_BUS": "1",  # no TLS on this server
        "NEURON_DRA_KUBECONFIG": str(kube_stack.kubeconfig),
        "NEURON_DRA_NAMESPACE": namespace,
        "NEURON_DRA_HTTP_HOST": "127.0.0.1",
        "NEURON_DRA_HTTP_PORT": str(http_port),
    }
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "neuron_dra_bus_auth"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    try:
        _wait_ready(http_port, proc, log)
        yield AuthenticatedBus(
            server=server, callout_log=log, stack=kube_stack, namespace=namespace, tokens=tokens
        )
    finally:
        _stop(proc)
        server.stop()
        kube_stack.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
