"""The authenticated bus on the local stack (``neuron-dra dev up``, the default).

What the ``bus-auth`` kustomize component does on a cluster, with processes: NATS reads the
component's own ``auth.conf`` (every client goes to the auth callout), the callout
``neuron-dra-bus-auth`` runs with a token of its ServiceAccount (TokenReview rights only), the
streams are declared once by ``neuron-dra-bus-declare`` as ``neuron-dra-bus-admin``, and each
service process gets a bus token of its own ServiceAccount for the audience
``neuron-dra-bus``, from the TokenRequest API. A node agent's token is bound to a pod of its
ServiceAccount on its node (the pod the DaemonSet would run there; the simulated kubelet runs
it with its fake runtime), so the apiserver writes the node's name into it, as into a
projected token on a cluster.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

import yaml

from neuron_dra_cli.errors import CliError
from neuron_dra_cli.stack import accounts, bytecode, kubectl
from neuron_dra_cli.stack.components import Component, python_service
from neuron_dra_cli.stack.layout import Layout
from neuron_dra_cli.stack.pki import Pki

if TYPE_CHECKING:
    from neuron_dra_common.bus import BusCredentials

__all__ = [
    "ADMIN",
    "AUDIENCE",
    "COMPONENT",
    "KIND",
    "READER",
    "BusAuth",
    "admin_credentials",
    "callout_component",
    "declare_streams",
    "prepare",
    "with_tokens",
]

KIND: Final = "bus-auth"
COMPONENT: Final = accounts.REPO / "deploy" / "kustomize" / "components" / "bus-auth"
#: The audience of every bus token (the component's projected volumes ask for the same).
AUDIENCE: Final = "neuron-dra-bus"
ADMIN: Final = "neuron-dra-bus-admin"
#: The identity of a person reading the bus (``neuron-dra events``): every stream, no writes.
READER: Final = "neuron-dra-bus-reader"
CALLOUT_ACCOUNT: Final = "neuron-dra-bus-auth"
#: The services with a bus identity, by the stack's component kind; a node agent's token is
#: bound to its node.
NODE_AGENTS: Final = frozenset({"discovery", "health-probe", "kubelet-plugin", "device-plugin"})
CLUSTER_SERVICES: Final = frozenset(
    {
        "slice-publisher",
        "topology-allocator",
        "ultraserver-operator",
        "failure-detector",
        "alerts",
        "audit",
    }
)


@dataclass(frozen=True)
class BusAuth:
    """Where the stack keeps the callout's keys, NATS's config and the bus tokens."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / "auth.conf"

    @property
    def keys(self) -> Path:
        return self.root / "keys"

    @property
    def tokens(self) -> Path:
        return self.root / "tokens"

    @property
    def tls_ca(self) -> Path:
        """The CA that signed NATS's certificate: what every client of the stack trusts."""
        return Layout(self.root.parent).pki / "ca.crt"

    def client_env(self) -> dict[str, str]:
        """What a client of the stack's bus needs besides its token: TLS to the server."""
        return {"NEURON_DRA_NATS_TLS_CA": str(self.tls_ca)}

    def token(self, account: str, node: str = "") -> Path:
        return self.tokens / (f"{account}@{node}.token" if node else f"{account}.token")

    def nats_env(self) -> dict[str, str]:
        """What the component's StatefulSet reads from the Secret, read from the key files."""
        return {
            "NEURON_DRA_BUS_AUTH_ISSUER": (self.keys / "issuer.pub").read_text().strip(),
            "NEURON_DRA_BUS_AUTH_PASSWORD": (self.keys / "password").read_text().strip(),
        }


def admin_credentials(state_dir: Path) -> BusCredentials:
    """The bus admin of the stack under ``state_dir`` (its token and the CA of NATS's
    certificate): what a test or benchmark publishing as a stand-in for the agents uses. None
    on a stack started with ``--insecure-bus``."""
    from neuron_dra_common.bus import BusCredentials

    files = BusAuth(state_dir / "bus-auth")
    token = files.token(ADMIN)
    if not token.exists():
        return BusCredentials()
    return BusCredentials(token_file=str(token), tls_ca=str(files.tls_ca))


#: The NATS account the callout places every admitted client in (the component's auth.conf).
ACCOUNT: Final = "NEURON"


def streams_to_account(jetstream: Path) -> bool:
    """A stack that ran the open bus (``--insecure-bus``) kept its streams in NATS's global
    account; every client is now placed in :data:`ACCOUNT`: move them there, messages and
    consumers' positions with them, as the StatefulSet's init container does on a cluster.
    Only while that account has none; returns whether it moved them."""
    old, new = jetstream / "$G", jetstream / ACCOUNT
    if not (old / "streams").is_dir() or new.exists():
        return False
    old.rename(new)
    return True


def prepare(layout: Layout) -> BusAuth:
    """Keys (kept across restarts of the stack), NATS's config, and the streams of an
    earlier open bus moved to the authenticated account."""
    streams_to_account(layout.root / "nats" / "jetstream")
    files = BusAuth(layout.root / "bus-auth")
    files.tokens.mkdir(parents=True, exist_ok=True)
    made = subprocess.run(
        [sys.executable, "-m", "neuron_dra_bus_auth.keys", "--out-dir", str(files.keys)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **bytecode.python_env()},
    )
    if made.returncode != 0:
        raise CliError(f"neuron-dra-bus-auth-keys failed: {made.stderr.strip()}")
    shutil.copyfile(COMPONENT / "auth.conf", files.config)
    # auth.conf includes the overlay's server config (here the command line sets listen,
    # JetStream and storage) and tls.conf, here with the stack's own certificate for NATS.
    (files.root / "nats.conf").write_text(
        "# The local stack sets listen, JetStream and storage by nats-server's flags.\n"
    )
    cert = Pki(layout.pki).nats()
    (files.root / "tls.conf").write_text(
        f'tls {{\n  cert_file: "{cert.cert}"\n  key_file: "{cert.key}"\n  timeout: 5\n}}\n'
    )
    return files


def _create_token(admin_kubeconfig: Path, account: str, *, pod: str = "") -> str:
    args = [
        "create",
        "token",
        account,
        "-n",
        accounts.NAMESPACE,
        f"--audience={AUDIENCE}",
        f"--duration={accounts.TOKEN_DURATION}",
    ]
    if pod:
        args += ["--bound-object-kind=Pod", f"--bound-object-name={pod}"]
    return kubectl.run(admin_kubeconfig, args).stdout.strip()


def _write_token(path: Path, token: str) -> Path:
    path.write_text(token)
    path.chmod(0o600)
    return path


def agent_pod(kind: str, node: str) -> str:
    """The name of the pod that stands for node agent ``kind`` on ``node``."""
    return f"neuron-dra-{kind}-{node}"


def _agent_pods(admin_kubeconfig: Path, agents: Iterable[tuple[str, str]]) -> None:
    docs = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": agent_pod(kind, node),
                "namespace": accounts.NAMESPACE,
                "labels": {
                    "app.kubernetes.io/name": f"neuron-dra-{kind}",
                    "app.kubernetes.io/part-of": "neuron-dra",
                },
            },
            "spec": {
                "nodeName": node,
                "serviceAccountName": f"neuron-dra-{kind}",
                "automountServiceAccountToken": False,
                # The agent itself runs as a process of the stack; the simulated kubelet
                # runs this pod with its fake runtime and never pulls the image.
                "containers": [{"name": kind, "image": "localhost/neuron-dra:0.1.0"}],
                "tolerations": [{"operator": "Exists"}],
            },
        }
        for kind, node in agents
    ]
    if docs:
        kubectl.run(admin_kubeconfig, ["apply", "-f", "-"], input=yaml.safe_dump_all(docs))


def with_tokens(
    components: Sequence[Component], *, files: BusAuth, admin_kubeconfig: Path
) -> list[Component]:
    """``components`` with ``NEURON_DRA_NATS_TOKEN_FILE`` set: a bus token of each service's
    own ServiceAccount, bound to its node's pod for a node agent."""
    agents = sorted({_key(c) for c in components if c.kind in NODE_AGENTS})
    _agent_pods(admin_kubeconfig, agents)
    wanted: dict[tuple[str, str], Path] = {
        _key(c): files.token(f"neuron-dra-{c.kind}", _key(c)[1])
        for c in components
        if c.kind in NODE_AGENTS | CLUSTER_SERVICES
    }

    def issue(item: tuple[tuple[str, str], Path]) -> None:
        (kind, node), path = item
        pod = agent_pod(kind, node) if node else ""
        _write_token(path, _create_token(admin_kubeconfig, f"neuron-dra-{kind}", pod=pod))

    # A kubectl call is mostly waiting on the apiserver: a few at once.
    with ThreadPoolExecutor(max_workers=4, thread_name_prefix="bus-tokens") as pool:
        list(pool.map(issue, wanted.items()))
    return [
        dataclasses.replace(
            c,
            env={
                **c.env,
                **files.client_env(),
                "NEURON_DRA_NATS_TOKEN_FILE": str(wanted[_key(c)]),
            },
        )
        if _key(c) in wanted
        else c
        for c in components
    ]


def _key(c: Component) -> tuple[str, str]:
    """Whose token ``c`` needs: its kind, and its node for a node agent."""
    return (c.kind, c.env["NEURON_DRA_NODE_NAME"] if c.kind in NODE_AGENTS else "")


def callout_component(*, files: BusAuth, nats_url: str, kubeconfig: Path) -> Component:
    """The auth callout; ``kubeconfig`` holds a token of its own ServiceAccount."""
    return python_service(
        name=KIND,
        kind=KIND,
        module="neuron_dra_bus_auth",
        ready_path="/readyz",
        env={
            "NEURON_DRA_NATS_SERVERS": nats_url,
            "NEURON_DRA_KUBECONFIG": str(kubeconfig),
            "NEURON_DRA_NAMESPACE": accounts.NAMESPACE,
            "NEURON_DRA_ISSUER_SEED_FILE": str(files.keys / "issuer.nk"),
            "NEURON_DRA_NATS_PASSWORD_FILE": str(files.keys / "password"),
            "NEURON_DRA_TOKEN_AUDIENCES": AUDIENCE,
            **files.client_env(),
        },
    )


def declare_streams(*, files: BusAuth, nats_url: str, admin_kubeconfig: Path) -> str:
    """Declare every stream as the bus's admin (a token of ``neuron-dra-bus-admin``, kept
    for the stack's operator); returns what the command printed."""
    token = _write_token(files.token(ADMIN), _create_token(admin_kubeconfig, ADMIN))
    # A reader's token too, for `neuron-dra events` on this stack.
    _write_token(files.token(READER), _create_token(admin_kubeconfig, READER))
    proc = subprocess.run(
        [sys.executable, "-m", "neuron_dra_bus_auth.declare"],
        capture_output=True,
        text=True,
        timeout=300,
        env={
            **os.environ,
            **bytecode.python_env(),
            "NEURON_DRA_NATS_SERVERS": nats_url,
            "NEURON_DRA_NATS_TOKEN_FILE": str(token),
            **files.client_env(),
            "NEURON_DRA_WAIT_SECONDS": "60",
        },
    )
    if proc.returncode != 0:
        raise CliError(
            f"declaring the streams as {ADMIN} failed ({proc.returncode}): "
            f"{proc.stderr.strip()[-2000:]}"
        )
    return proc.stdout
