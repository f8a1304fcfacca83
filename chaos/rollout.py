"""A rolling update of a node's kubelet plugin whose new pod dies at each step (goal R4).

The plugin's DaemonSet rolls with ``maxSurge: 1``: for a while a node runs the old plugin and
the new one, each with its own sockets (named after its pod), on the node's one checkpoint.
The kubelet sends a claim to the newest plugin that is connected, and to an older one once the
newest is gone. Here the new plugin is a second process of the node's plugin, with sockets
named after a pod UID of its own and the crash point set to one step of prepare or
unprepare; a pod asking for a device of that node makes the kubelet call it, and it kills
itself at that step. The kubelet then tries again on the old plugin, which must finish the
work on the checkpoint the dead one left: the pod runs (or is gone), and the node's
checkpoint and CDI specs hold exactly the claims of its running pods, no device twice.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from neuron_dra_cli.stack import probes, process, state
from neuron_dra_common import cdi
from neuron_dra_kubelet_plugin.checkpoint import CheckpointStore
from neuron_dra_kubelet_plugin.faults import CRASH_ENV, STEPS
from neuron_dra_kubelet_plugin.registration import socket_paths

from chaos.invariants import running_claims

__all__ = ["StepResult", "get_pod", "node_problems", "roll"]

Obj = dict[str, Any]
#: Seconds a step may take from the pod's creation (or deletion) until the node converged:
#: the kubelet retries a failed prepare or unprepare with its own backoff.
STEP_PATIENCE = 240.0


class Kube(Protocol):
    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str: ...

    def items(self, *args: str) -> list[Obj] | None: ...


class StepResult(NamedTuple):
    step: str
    node: str
    #: From the pod's creation (prepare steps) or deletion (unprepare steps) until converged.
    seconds: float
    #: Empty when the step converged; else what did not.
    problem: str = ""


def node_problems(kube: Kube, namespace: str, node: str, plugin_env: dict[str, str]) -> list[str]:
    """How the node's checkpoint and CDI specs differ from the claims of its running pods."""
    pods = kube.items("pods", "-n", namespace)
    claims = kube.items("resourceclaims", "-n", namespace)
    if pods is None or claims is None:
        return ["the apiserver does not answer"]
    running = {uid for on, uid in running_claims(pods, claims) if on == node}
    paths = socket_paths(Path(plugin_env["NEURON_DRA_KUBELET_ROOT"]))
    entries = CheckpointStore(paths.dra.parent / "checkpoint.json").load().claims
    specs = cdi.claim_spec_uids(Path(plugin_env["NEURON_DRA_CDI_ROOT"]))
    problems = []
    if set(entries) != running:
        problems.append(f"checkpoint holds {sorted(entries)}, running pods {sorted(running)}")
    if specs != set(entries):
        problems.append(f"CDI specs {sorted(specs)}, checkpoint {sorted(entries)}")
    held = Counter(d.device for e in entries.values() for d in e.devices)
    problems += [f"{device} held {n} times" for device, n in held.items() if n > 1]
    return problems


def _wait(what: str, done: Callable[[], bool], within: float) -> str:
    deadline = time.monotonic() + within
    while not done():
        if time.monotonic() > deadline:
            return f"timed out after {within:.0f} s waiting for {what}"
        time.sleep(0.5)
    return ""


def get_pod(kube: Kube, namespace: str, name: str) -> Obj | None:
    """Pod ``name`` as the apiserver has it; None when it is gone (or the apiserver away)."""
    pods = kube.items("pods", "-n", namespace, "--field-selector", f"metadata.name={name}")
    return pods[0] if pods else None


def roll(
    kube: Kube,
    *,
    state_dir: Path,
    plugin: state.ComponentState,
    step: str,
    pod: Obj,
    namespace: str,
    serial: int,
) -> StepResult:
    """One rolling update of ``plugin``'s node whose new plugin dies at ``step``."""
    if step not in STEPS:
        raise ValueError(f"step {step!r}: expected one of {', '.join(STEPS)}")
    node = plugin.env["NEURON_DRA_NODE_NAME"]
    uid = f"roll{serial}"  # short: the socket paths must stay under 107 bytes
    port = process.free_port()
    surge = process.start(
        plugin.argv,
        log_path=state_dir / "logs" / f"{plugin.name}-{uid}.log",
        env={
            **plugin.env,
            "NEURON_DRA_POD_UID": uid,
            "NEURON_DRA_HTTP_PORT": str(port),
            CRASH_ENV: step,
        },
    )
    name = pod["metadata"]["name"]
    pinned = json.loads(json.dumps(pod))
    pinned["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    problem = ""
    try:
        problem = _wait(
            "the new plugin to be registered",
            lambda: probes.http_ok(f"http://127.0.0.1:{port}/readyz"),
            60,
        )
        if problem:
            return StepResult(step, node, 0.0, problem)

        def running() -> bool:
            p = get_pod(kube, namespace, name)
            return p is not None and (p.get("status") or {}).get("phase") == "Running"

        def dead() -> bool:
            return not process.alive(surge)

        started = time.monotonic()
        kube.kubectl("apply", "-f", "-", input=json.dumps(pinned))
        if step.startswith("prepare:"):
            # The new plugin is asked first, and dies; the old one prepares on retry.
            problem = _wait(f"the new plugin to die at {step}", dead, STEP_PATIENCE)
            problem = problem or _wait(f"pod {name} Running", running, STEP_PATIENCE)
        else:
            # The new plugin prepares; it dies unpreparing, and the old one finishes.
            problem = _wait(f"pod {name} Running", running, STEP_PATIENCE)
            started = time.monotonic()
            kube.kubectl("delete", "pod", name, "-n", namespace, "--wait=false")
            problem = problem or _wait(f"the new plugin to die at {step}", dead, STEP_PATIENCE)
            problem = problem or _wait(
                f"pod {name} gone", lambda: get_pod(kube, namespace, name) is None, STEP_PATIENCE
            )
        if not problem:
            left: list[str] = []

            def consistent() -> bool:
                left[:] = node_problems(kube, namespace, node, plugin.env)
                return not left

            if _wait("the node's checkpoint", consistent, 60):
                problem = "; ".join(left)
        return StepResult(step, node, time.monotonic() - started, problem)
    finally:
        if process.alive(surge):
            process.stop([surge])
        # The pod of a plugin that is gone leaves no sockets behind for the kubelet.
        sockets = socket_paths(Path(plugin.env["NEURON_DRA_KUBELET_ROOT"]), pod_uid=uid)
        for sock in (sockets.registration, sockets.dra):
            sock.unlink(missing_ok=True)
        kube.kubectl("delete", "pod", name, "-n", namespace, "--timeout=120s", check=False)
