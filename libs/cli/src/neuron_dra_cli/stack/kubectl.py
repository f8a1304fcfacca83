"""The pinned kubectl, as the stack and its users call it."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

from neuron_dra_cli.stack.components import venv_binary


def run(
    kubeconfig: Path, args: Sequence[str], *, input: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run kubectl against the stack; raise with its stderr when it fails and ``check``."""
    proc = subprocess.run(
        [str(venv_binary("kubectl")), f"--kubeconfig={kubeconfig}", *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check and proc.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc


def has_default_service_account(kubeconfig: Path, namespace: str = "default") -> bool:
    """Whether ``namespace`` has its ``default`` ServiceAccount, without which the apiserver
    refuses every pod there (the controller manager creates it shortly after the namespace)."""
    return (
        run(
            kubeconfig, ["get", "serviceaccount", "default", "-n", namespace], check=False
        ).returncode
        == 0
    )


def ready_nodes(kubeconfig: Path) -> set[str]:
    """Names of the Nodes whose Ready condition is True (empty if the API is unreachable)."""
    proc = run(kubeconfig, ["get", "nodes", "-o", "json"], check=False)
    if proc.returncode != 0:
        return set()
    ready: set[str] = set()
    for item in json.loads(proc.stdout).get("items", []):
        for cond in item.get("status", {}).get("conditions", []):
            if cond.get("type") == "Ready" and cond.get("status") == "True":
                ready.add(item["metadata"]["name"])
    return ready


def node_names(kubeconfig: Path) -> set[str]:
    """Names of every Node the cluster has."""
    proc = run(kubeconfig, ["get", "nodes", "-o", "name"])
    return {line.removeprefix("node/") for line in proc.stdout.split()}
