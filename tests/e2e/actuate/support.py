"""The product's kubelet path on the local stack: every simulated node runs the kubelet
plugin, and tests drive it through the real kubelet, scheduler and controllers.

When the stack does not start the plugins (or the slice publisher) itself, this module does:
plugins with ``stack.plugin.plugin_components`` recorded in the stack's state (so
``dev down`` stops them), and a ResourceSlice per Neuron node built the way the slice
publisher builds it, from the same simulated hardware.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from neuron_dra_cli.stack import process, state
from neuron_dra_cli.stack.components import Component
from neuron_dra_cli.stack.fleet import Fleet, NodeSpec, load_fleet
from neuron_dra_cli.stack.layout import Layout
from neuron_dra_cli.stack.plugin import (
    KIND,
    apply_plugin_rbac,
    cdi_root,
    plugin_component,
)
from neuron_dra_common import cdi
from neuron_dra_common.driver import DRIVER_NAME as DRIVER
from neuron_dra_kubelet_plugin.checkpoint import CheckpointStore

from tests.fixtures.processes import start_recorded, wait_gone
from tests.fixtures.stack import KubeStack

MANIFESTS = Path(__file__).parent / "manifests"


@dataclass
class Actuate:
    """The stack plus handles on each node's plugin process."""

    stack: KubeStack
    fleet: Fleet
    layout: Layout
    plugin_kubeconfig: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    # --- nodes and files -------------------------------------------------------------
    def node(self, name: str) -> NodeSpec:
        return next(n for n in self.fleet.nodes if n.name == name)

    def trn2_nodes(self) -> list[str]:
        return [n.name for n in self.fleet.nodes if n.instance_type == "trn2.48xlarge" and n.dra]

    def cdi_specs(self, node: str) -> dict[str, cdi.Spec]:
        """Claim UID -> the CDI spec the node's plugin wrote for it."""
        root = cdi_root(self.layout, node)
        return {
            uid: spec
            for uid in sorted(cdi.claim_spec_uids(root))
            if (spec := cdi.read_claim_spec(root, uid)) is not None
        }

    def checkpoint_path(self, node: str) -> Path:
        root = self.layout.node_dir(node) / "kubelet" / "plugins" / DRIVER
        return root / "checkpoint.json"

    def checkpoint(self, node: str) -> dict[str, Any]:
        """Claim UID -> checkpoint entry (JSON form), base and journal as the plugin reads them."""
        claims: dict[str, Any] = msgspec.to_builtins(
            CheckpointStore(self.checkpoint_path(node)).load().claims
        )
        return claims

    def log(self, node: str) -> Path:
        return self.layout.log(f"{KIND}-{node}")

    # --- plugin processes ------------------------------------------------------------
    def component(self, node: str, *, env: dict[str, str] | None = None) -> Component:
        return plugin_component(
            node=self.node(node),
            layout=self.layout,
            nats_url=self.stack.nats_url,
            kubeconfig=self.plugin_kubeconfig,
            env={**self.stack.service_env(), **(env or {})},
        )

    def plugin_pid(self, node: str) -> int | None:
        """The pid of node's running plugin, whoever started it."""
        proc = self.procs.get(node)
        if proc is not None:
            return proc.pid if proc.poll() is None else None
        current = state.load(self.layout.root)
        for c in current.components if current else ():
            if c.name == f"{KIND}-{node}" and process.alive(
                process.Running(pid=c.pid, start_ticks=c.start_ticks)
            ):
                return c.pid
        return None

    def kill_plugin(self, node: str) -> None:
        """``kill -9`` node's plugin and wait until it is gone."""
        pid = self.plugin_pid(node)
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            wait_gone(pid)
        proc = self.procs.pop(node, None)
        if proc is not None:
            proc.wait(timeout=10)

    def start_plugin(self, node: str, *, env: dict[str, str] | None = None) -> int:
        """Start node's plugin (the old one must be gone), recorded for ``dev down``."""
        c = self.component(node, env=env)
        proc = start_recorded(self.layout, c, log=self.layout.log(c.name))
        self.procs[node] = proc
        return proc.pid

    def wait_exited(self, node: str, *, timeout: float = 60) -> int:
        """Wait for node's plugin (started here) to exit; its exit status."""
        proc = self.procs[node]
        code = proc.wait(timeout=timeout)
        del self.procs[node]
        return code

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.procs.clear()

    def wait_plugin_ready(self, node: str, *, timeout: float = 60) -> None:
        """Wait until the node's kubelet registered its plugin (``/readyz`` answers 200)."""
        from neuron_dra_cli.stack.probes import http_ok

        current = state.load(self.layout.root)
        assert current is not None
        port = next(c.ports["http"] for c in current.components if c.name == f"{KIND}-{node}")
        proc = self.procs.get(node)

        def ready() -> bool:
            if proc is not None and proc.poll() is not None:
                tail = self.log(node).read_text().splitlines()[-15:]
                raise AssertionError(
                    f"plugin of {node} exited ({proc.returncode}):\n" + "\n".join(tail)
                )
            return http_ok(f"http://127.0.0.1:{port}/readyz")

        self.stack.wait_for(f"the plugin of {node} to be registered", ready, timeout=timeout)

    # --- pods --------------------------------------------------------------------------
    def apply(self, manifest: dict[str, Any] | list[dict[str, Any]]) -> None:
        items = manifest if isinstance(manifest, list) else [manifest]
        self.stack.kubectl(
            "apply",
            "-f",
            "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
        )

    def pod(self, name: str, namespace: str = "default") -> dict[str, Any]:
        result: dict[str, Any] = self.stack.get_json("pod", name, "-n", namespace)
        return result

    def wait_running(self, name: str, namespace: str = "default", timeout: float = 90) -> Any:
        return self.stack.wait_for(
            f"pod {namespace}/{name} to be Running",
            lambda: (p := self.pod(name, namespace))["status"].get("phase") == "Running" and p,
            timeout=timeout,
        )

    def claim_of(self, pod: str, namespace: str = "default") -> dict[str, Any]:
        claims: list[dict[str, Any]] = self.stack.get_json("resourceclaims", "-n", namespace)[
            "items"
        ]
        mine = [
            c
            for c in claims
            if any(o.get("name") == pod for o in c["metadata"].get("ownerReferences", []))
        ]
        assert len(mine) == 1, [c["metadata"]["name"] for c in mine]
        return mine[0]

    def events_for(self, pod: str, namespace: str = "default") -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.stack.get_json(
            "events", "-n", namespace, "--field-selector", f"involvedObject.name={pod}"
        )["items"]
        return items

    def delete_pod(self, name: str, namespace: str = "default", timeout: float = 90) -> None:
        self.stack.kubectl(
            "delete", "pod", name, "-n", namespace, "--wait=false", "--ignore-not-found"
        )
        self.stack.wait_for(
            f"pod {namespace}/{name} to be gone",
            lambda: (
                self.stack.kubectl("get", "pod", name, "-n", namespace, check=False).returncode != 0
            ),
            timeout=timeout,
        )


def bring_up(stack: KubeStack) -> Iterator[Actuate]:
    """Wait until the plugin of every DRA node is ready (``dev up`` starts them); yield the
    handle."""
    layout = Layout(stack.state_dir)
    current = state.load(layout.root)
    assert current is not None
    fleet = load_fleet(Path(current.fleet))
    own = apply_plugin_rbac(layout=layout, kubeconfig=Path(current.kubeconfig))
    actuate = Actuate(stack=stack, fleet=fleet, layout=layout, plugin_kubeconfig=own)
    try:
        for node in fleet.nodes:
            if node.dra:
                actuate.wait_plugin_ready(node.name, timeout=120)
        yield actuate
    finally:
        actuate.stop_all()


def decode_spec(spec: cdi.Spec) -> dict[str, Any]:
    result: dict[str, Any] = msgspec.to_builtins(spec)
    return result


def ranges(ids: list[int]) -> str:
    out: list[str] = []
    for i in sorted(ids):
        if out and out[-1].split("-")[-1] == str(i - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{i}"
        else:
            out.append(str(i))
    return ",".join(out)


def spec_view(actuate: Actuate, pod: str) -> tuple[str, dict[str, Any], list[int], dict[str, str]]:
    """(node, claim, allocated device indices, CDI env) of ``pod``'s one claim."""
    node = actuate.pod(pod)["spec"]["nodeName"]
    claim = actuate.claim_of(pod)
    results = claim["status"]["allocation"]["devices"]["results"]
    indices = sorted(int(r["device"].removeprefix("neurondevice")) for r in results)
    spec = actuate.cdi_specs(node)[claim["metadata"]["uid"]]
    paths = sorted(n.path for d in spec.devices for n in d.container_edits.device_nodes)
    assert paths == sorted(f"/dev/neuron{i}" for i in indices)
    env = dict(e.split("=", 1) for e in spec.container_edits.env)
    return node, claim, indices, env


def guide_1x4_running(
    actuate: Actuate, *, timeout: float = 120
) -> tuple[str, dict[str, Any], list[int], dict[str, str]]:
    """Apply the guide's 1x4 example and check what its pod got: four connected devices (one
    aligned row) with their cores at the default LNC=2, the claim prepared. The caller deletes
    ``pod0``."""
    actuate.stack.kubectl("apply", "-f", str(MANIFESTS / "aws-dra-guide-1x4.yaml"))
    actuate.wait_running("pod0", timeout=timeout)
    node, claim, indices, env = spec_view(actuate, "pod0")
    assert len(indices) == 4
    assert indices[0] % 4 == 0
    assert indices == list(range(indices[0], indices[0] + 4))
    # trn2 at the default LNC=2: device d owns logical cores 4d..4d+3.
    assert env["NEURON_RT_VISIBLE_CORES"] == ranges([4 * d + c for d in indices for c in range(4)])
    assert env["NEURON_LOGICAL_NC_CONFIG"] == "2"
    assert actuate.checkpoint(node)[claim["metadata"]["uid"]]["state"] == "PrepareCompleted"
    return node, claim, indices, env


def guide_lnc1_running(actuate: Actuate, *, timeout: float = 120) -> None:
    """Apply the guide's dynamic LNC example and check what its pod got: all 16 devices of a
    trn2 node at LNC=1, so cores 0-127. The caller deletes ``pod0``."""
    actuate.stack.kubectl("apply", "-f", str(MANIFESTS / "aws-dra-guide-lnc1.yaml"))
    actuate.wait_running("pod0", timeout=timeout)
    _, _, indices, env = spec_view(actuate, "pod0")
    assert indices == list(range(16))
    assert env["NEURON_LOGICAL_NC_CONFIG"] == "1"
    # LNC=1: device d owns cores 8d..8d+7, so all 16 devices are cores 0-127.
    assert env["NEURON_RT_VISIBLE_CORES"] == "0-127"
