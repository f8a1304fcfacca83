"""One control plane for the extender's tests: etcd and kube-apiserver, the extender as a
process with its own user (bound to the component's ClusterRole), and the real kube-scheduler
twice, configured from the component's files, the two ways AWS's guide shows: a second
scheduler with the profile `my-scheduler`, and the default scheduler with the extender. The
schedulers call the extender's verbs over HTTPS with their client certificate, as the
component configures them, from a CA of the extender's own.

No kubelet: Nodes are API objects with the Neuron capacity AWS's device plugin reports, which
is all the scheduler reads; binding is what these tests look at.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from neuron_dra_cli import kubebuild
from neuron_dra_cli.stack import components as comp
from neuron_dra_cli.stack import process
from neuron_dra_cli.stack.pki import CertPair, Pki, write_kubeconfig
from neuron_dra_cli.stack.realdeviceplugin import (
    ExtenderTls,
    extender,
    extender_tls,
    scheduler_config,
)

from tests.unit.deploy.test_kustomize import KUSTOMIZE

COMPONENT = KUSTOMIZE / "components" / "scheduler-extender"
NAMESPACE = "extender-test"
EXTENDER_USER = "neuron-dra-scheduler-extender"

#: name -> instance type. One node per test, so the tests do not share devices.
NODES = {
    "inf2-ring": "inf2.48xlarge",
    "trn1-rows": "trn1.32xlarge",
    "inf1-cores": "inf1.6xlarge",
    "trn2-row": "trn2.48xlarge",
    "inf2-restart": "inf2.48xlarge",
    "trn2-race": "trn2.48xlarge",
    "trn2-stale": "trn2.48xlarge",
    "trn2-last": "trn2.48xlarge",
    "trn2-frag-0": "trn2.48xlarge",
    "trn2-frag-1": "trn2.48xlarge",
    "trn2-attack": "trn2.48xlarge",
    "trn2-unmanaged": "trn2.48xlarge",
}
CORES_PER_DEVICE = {"inf2.48xlarge": 2, "trn1.32xlarge": 2, "inf1.6xlarge": 4, "trn2.48xlarge": 4}
DEVICES = {"inf2.48xlarge": 12, "trn1.32xlarge": 16, "inf1.6xlarge": 4, "trn2.48xlarge": 16}


class Proc:
    """A component in its own session, logging to ``log``; the Popen is kept so that it is
    waited for."""

    def __init__(self, argv: list[str], *, log: Path, env: dict[str, str]) -> None:
        self.log = log
        with open(log, "ab") as out:
            self.popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **env},
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self) -> int:
        if self.alive():
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                return self.popen.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
        return self.popen.wait(timeout=20)


@dataclass
class ExtenderCluster:
    root: Path
    kubeconfig: Path
    #: The verbs' port (HTTPS, client certificates); the probes and metrics are on
    #: ``probe_port`` (plain HTTP).
    extender_port: int
    probe_port: int
    tls: ExtenderTls
    start_extender: Callable[[], Proc] | None = None
    extender: Proc | None = None

    def client_context(self, pair: CertPair | None = None) -> ssl.SSLContext:
        """A client's TLS: trusts the extender's CA and shows ``pair`` (by default the
        schedulers' client certificate)."""
        context = ssl.create_default_context(cafile=str(self.tls.ca))
        chosen = pair or self.tls.client
        context.load_cert_chain(str(chosen.cert), str(chosen.key))
        return context

    def anonymous_context(self) -> ssl.SSLContext:
        """A client that checks the extender's certificate and shows none of its own."""
        return ssl.create_default_context(cafile=str(self.tls.ca))

    def call(self, verb: str, args: dict[str, Any]) -> dict[str, Any]:
        """POST ``args`` to the verb as the scheduler does, with its client certificate; the
        decoded answer."""
        request = urllib.request.Request(
            f"https://127.0.0.1:{self.extender_port}/{verb}",
            data=json.dumps(args).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30, context=self.client_context()) as resp:
            answer: dict[str, Any] = json.loads(resp.read())
            return answer

    def metrics(self) -> str:
        """The extender's /metrics, from its plain probes port."""
        url = f"http://127.0.0.1:{self.probe_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            text: str = resp.read().decode()
            return text

    def kubectl(self, *args: str, input: str | None = None) -> str:
        kubectl = Path(sys.executable).parent / "kubectl"
        proc = subprocess.run(
            [str(kubectl), f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {proc.stderr}")
        return proc.stdout

    def apply(self, *docs: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(d) for d in docs))

    def pod(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(
            self.kubectl("get", "pod", name, "-n", NAMESPACE, "-o", "json")
        )
        return found

    def wait_for(self, what: str, check: Callable[[], Any], *, timeout: float = 180) -> Any:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            last = check()
            if last:
                return last
            time.sleep(0.3)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")

    def restart_extender(self) -> int:
        """Stop the extender with SIGTERM, start a new one; the old one's exit code."""
        assert self.extender is not None
        assert self.start_extender is not None
        code = self.extender.stop()
        self.extender = self.start_extender()
        return code


def node(name: str, instance_type: str) -> dict[str, Any]:
    devices = DEVICES[instance_type]
    capacity = {
        "cpu": "96",
        "memory": "384Gi",
        "pods": "110",
        "aws.amazon.com/neuron": str(devices),
        "aws.amazon.com/neuroncore": str(devices * CORES_PER_DEVICE[instance_type]),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "node.kubernetes.io/instance-type": instance_type,
            },
        },
        "status": {"capacity": capacity, "allocatable": capacity},
    }


def _wait(what: str, ready: Callable[[], bool], proc: Proc) -> None:
    # Generous: on a busy machine the apiserver takes minutes to be ready.
    deadline = time.monotonic() + 300
    while not ready():
        if not proc.alive():
            raise AssertionError(f"{what} exited; its log:\n{process.tail(proc.log, lines=30)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not ready in 300 s; its log:\n{process.tail(proc.log)}")
        time.sleep(0.2)


def _scheduler_config(
    source: Path,
    *,
    url: str,
    kubeconfig: Path,
    out: Path,
    tls: ExtenderTls,
    node_cache: bool | None = None,
) -> Path:
    """The component's KubeSchedulerConfiguration, pointed at this extender and apiserver
    with these certificates (``node_cache``: ``nodeCacheCapable`` set so, else as the
    component has it)."""
    config = scheduler_config(
        yaml.safe_load(source.read_text()), extender_url=url, node_cache=node_cache, tls=tls
    )
    config["clientConnection"] = {"kubeconfig": str(kubeconfig)}
    config["leaderElection"] = {"leaderElect": False}
    out.write_text(yaml.safe_dump(config))
    return out


@pytest.fixture(scope="module")
def extender_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExtenderCluster]:
    bins = kubebuild.ensure_binaries(progress=lambda _m: None)
    root = tmp_path_factory.mktemp("extender-cluster")
    pki = Pki(root / "pki")
    admin = pki.client("admin", user="kubernetes-admin", groups=("system:masters",))
    ports = {n: process.free_port() for n in ("etcd", "peer", "api", "s1", "s2")}
    tls = extender_tls(root / "extender-pki")
    server = f"https://127.0.0.1:{ports['api']}"
    started: list[Proc] = []

    def launch(c: comp.Component) -> Proc:
        proc = Proc(c.argv, log=root / f"{c.name}.log", env=c.env)
        started.append(proc)
        _wait(c.name, c.ready, proc)
        return proc

    def kubeconfig(stem: str, user: str, groups: tuple[str, ...] = ()) -> Path:
        return write_kubeconfig(
            root / f"{stem}.kubeconfig",
            server=server,
            ca=pki.ca.cert,
            pair=pki.client(stem, user=user, groups=groups),
            user=user,
        )

    try:
        launch(
            comp.etcd(binary=bins.etcd, state_dir=root, port=ports["etcd"], peer_port=ports["peer"])
        )
        launch(
            comp.apiserver(
                binary=bins.kube_apiserver,
                pki=pki,
                etcd_port=ports["etcd"],
                port=ports["api"],
                admin=admin,
            )
        )
        admin_cfg = write_kubeconfig(
            root / "admin.kubeconfig",
            server=server,
            ca=pki.ca.cert,
            pair=admin,
            user="kubernetes-admin",
        )
        ext_cfg = kubeconfig("extender", EXTENDER_USER)
        ext = extender(kubeconfig=ext_cfg, tls=tls)
        cluster = ExtenderCluster(
            root=root,
            kubeconfig=admin_cfg,
            extender_port=ext.ports["verbs"],
            probe_port=ext.ports["http"],
            tls=tls,
        )
        # The extender as its own user, holding exactly the component's ClusterRole.
        [role] = [
            d
            for d in yaml.safe_load_all((COMPONENT / "rbac.yaml").read_text())
            if d["kind"] == "ClusterRole"
        ]
        cluster.apply(
            role,
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "test-extender-user"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": role["metadata"]["name"],
                },
                "subjects": [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": EXTENDER_USER}
                ],
            },
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
            *(node(n, t) for n, t in NODES.items()),
        )
        cluster.apply(
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": "default", "namespace": NAMESPACE},
            }
        )

        def start_extender() -> Proc:
            proc = Proc(ext.argv, log=root / "scheduler-extender.log", env=ext.env)
            started.append(proc)
            _wait("scheduler-extender", ext.ready, proc)
            return proc

        cluster.start_extender = start_extender
        cluster.extender = start_extender()
        url = f"https://127.0.0.1:{cluster.extender_port}"
        sched_cfg = kubeconfig("kube-scheduler", "system:kube-scheduler")
        for name, source, port in (
            ("my-scheduler", COMPONENT / "my-scheduler-config.yaml", ports["s1"]),
            (
                "default-scheduler",
                COMPONENT / "default-scheduler" / "kube-scheduler-config.yaml",
                ports["s2"],
            ),
        ):
            # The default scheduler sends whole Nodes (nodeCacheCapable: false, as a
            # configuration written for AWS's extension may), my-scheduler node names: each
            # form of the extender's arguments comes from the real scheduler.
            config = _scheduler_config(
                source,
                url=url,
                kubeconfig=sched_cfg,
                out=root / f"{name}.yaml",
                tls=tls,
                node_cache=False if name == "default-scheduler" else None,
            )
            launch(
                comp.scheduler(
                    binary=bins.kube_scheduler,
                    kubeconfig=sched_cfg,
                    port=port,
                    config=config,
                    name=name,
                    # Each scheduling attempt in the log, to read when a test fails.
                    verbosity=3,
                )
            )
        yield cluster
    finally:
        for proc in reversed(started):
            proc.stop()
