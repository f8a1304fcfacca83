"""A real nats-server whose clients are admitted by the real ``neuron-dra-bus-auth`` process,
which asks the local stack's real apiserver about their ServiceAccount tokens.

The server runs the component's own ``auth.conf`` (its accounts, JetStream limits and auth
callout), with the overlay's includes left out: the fixture gives the listen port and store.
"""

from __future__ import annotations

import contextlib
import os
import re
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

from tests.fixtures.nats import NatsServer, free_port
from tests.fixtures.stack import KubeStack

CALLOUT_USER = "neuron-dra-bus-auth"
#: The audience of every bus token (the component's projected volumes and the callout's default).
AUDIENCE = "neuron-dra-bus"
AUTH_CONF = Path(__file__).parents[3] / "deploy/kustomize/components/bus-auth/auth.conf"


def deployed_auth_conf(**limits: str) -> str:
    """The component's ``auth.conf`` without its includes; ``limits`` replace values of the
    NEURON account's JetStream limits (``max_file="64KB"``)."""
    text = "\n".join(
        line for line in AUTH_CONF.read_text().splitlines() if not line.startswith("include ")
    )
    for key, value in limits.items():
        text, count = re.subn(rf"(\n\s*{key}:\s*)\S+", rf"\g<1>{value}", text, count=1)
        assert count == 1, f"auth.conf has no {key}"
    return text


def neuron_limits() -> dict[str, str]:
    """The NEURON account's JetStream limits as auth.conf writes them."""
    block = AUTH_CONF.read_text().split("NEURON {", 1)[1].split("\n  }", 1)[0]
    return dict(re.findall(r"\n\s*(max_\w+):\s*(\S+)", block))


@dataclass
class AuthenticatedBus:
    """The server, the callout's log, and a way to get any identity's token."""

    server: NatsServer
    callout_log: Path
    stack: KubeStack
    namespace: str
    tokens: Path
    #: The callout's process (a test may pause it, as a callout slower than its clients).
    callout: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return self.server.url

    def token_file(self, service_account: str, *, pod: str = "", audience: str = AUDIENCE) -> Path:
        """A fresh token of ``service_account`` for ``audience``, bound to ``pod`` when given
        (then it carries the pod's node, as a projected token in that pod does)."""
        args = ["create", "token", service_account, "-n", self.namespace, "--duration=1h"]
        args.append(f"--audience={audience}")
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


@contextlib.contextmanager
def _authenticated_bus(
    kube_stack: KubeStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config_text: str
) -> Iterator[AuthenticatedBus]:
    namespace = f"busauth-{uuid.uuid4().hex[:6]}"
    kube_stack.create_namespace(namespace)
    for role in ROLES:
        kube_stack.kubectl("create", "serviceaccount", service_account_of(role), "-n", namespace)
    seed = new_account_seed()
    (tmp_path / "issuer.nk").write_bytes(seed)
    # auth.conf reads both from the server's environment, as the component's pod gives them;
    # a password must begin with a letter there (the server reads it as a config value).
    password = "p" + secrets.token_hex(16)
    (tmp_path / "password").write_text(password)
    monkeypatch.setenv("NEURON_DRA_BUS_AUTH_ISSUER", Signer(seed).public_key)
    monkeypatch.setenv("NEURON_DRA_BUS_AUTH_PASSWORD", password)
    config = tmp_path / "nats.conf"
    config.write_text(config_text)
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
            server=server,
            callout_log=log,
            stack=kube_stack,
            namespace=namespace,
            tokens=tokens,
            callout=proc,
        )
    finally:
        _stop(proc)
        server.stop()
        kube_stack.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


@pytest.fixture
def authenticated_bus(
    kube_stack: KubeStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[AuthenticatedBus]:
    """The component's server config as deployed, its callout, the stack's apiserver."""
    with _authenticated_bus(kube_stack, tmp_path, monkeypatch, deployed_auth_conf()) as bus:
        yield bus


@pytest.fixture
def small_store_bus(
    kube_stack: KubeStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[AuthenticatedBus]:
    """As deployed, but the account may store only 64 KiB on file: its storage limit is
    reached by a few messages instead of 8 GB."""
    conf = deployed_auth_conf(max_file="64KB")
    with _authenticated_bus(kube_stack, tmp_path, monkeypatch, conf) as bus:
        yield bus
